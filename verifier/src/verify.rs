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

    fn alu(&mut self, st: &mut State, i: &Insn) -> R<()> {
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
    fn unary(&mut self, st: &mut State, i: &Insn, is64: bool) -> R<()> {
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

    fn ptr_add(&self, p: Reg, s: Scalar, reg: u8) -> R<Reg> {
        match p {
            Reg::Ptr { nullable: true, .. } | Reg::MapPtr { .. } | Reg::Func { .. } => {
                Err(RejectKind::PtrArithProhibited {
                    reg,
                    ty: p.type_name(),
                })
            }
            Reg::Ptr {
                region,
                off_min,
                off_max,
                off_bits,
                ref_id,
                ..
            } => {
                if s.smin < -MAX_VAR_OFF || s.smax > MAX_VAR_OFF {
                    return Err(RejectKind::UnboundedOffset { reg });
                }
                let (lo, hi) = (off_min + s.smin, off_max + s.smax);
                if lo < -MAX_VAR_OFF || hi > MAX_VAR_OFF {
                    return Err(RejectKind::UnboundedOffset { reg });
                }
                Ok(Reg::Ptr {
                    region,
                    off_min: lo,
                    off_max: hi,
                    off_bits: off_bits.plus(s.tnum),
                    nullable: false,
                    id: 0,
                    ref_id,
                })
            }
            _ => Err(RejectKind::PtrArithProhibited {
                reg,
                ty: p.type_name(),
            }),
        }
    }

    // ---- memory ------------------------------------------------------------

    /// Like the kernel, the context is only read through the pointer the program
    /// got (its field offsets are rewritten per program type), never a moved copy.
    fn ctx_unmodified(reg: u8, off_min: i64, off_max: i64) -> R<()> {
        if off_min != off_max {
            return Err(RejectKind::VariableCtxAccess { reg });
        }
        if off_min != 0 {
            return Err(RejectKind::ModifiedCtxDeref { reg, off: off_min });
        }
        Ok(())
    }

    fn ctx_access(&self, off: i64, size: u32, write: bool) -> R<()> {
        let range = ctx_range(self.p.prog_type).unwrap_or(0..0);
        // A tracepoint's record is read-only, and so are a probe's registers: a uprobe
        // program does not change the traced code's state. Linux 6.18 takes a negative
        // offset into a tracepoint's record; what lies before it is not the program's.
        if write || off < range.start || off + size as i64 > range.end {
            return Err(RejectKind::CtxAccess { off, size });
        }
        if off % size as i64 != 0 {
            return Err(RejectKind::MisalignedCtxAccess { off, size });
        }
        Ok(())
    }

    /// Bounds of a sized region (map value, ring buffer record, buffer).
    fn region_bounds(region: Region, lo: i64, hi: i64, size: u64) -> R<()> {
        let (name, limit) = match region {
            Region::MapValue { size, .. } => ("map value", size),
            Region::Ringbuf { size } => ("ringbuf record", size),
            Region::Mem { size } => ("memory", size),
            Region::Task => return Err(RejectKind::TaskStructAccess),
            _ => unreachable!("only sized regions"),
        };
        if lo < 0 || hi + size as i64 > limit as i64 {
            return Err(RejectKind::RegionOutOfBounds {
                region: name,
                region_size: limit,
                off_min: lo,
                off_max: hi,
                size,
            });
        }
        Ok(())
    }

    fn not_memory(reg: u8, p: &Reg) -> RejectKind {
        RejectKind::InvalidMemAccess {
            reg,
            ty: p.type_name(),
        }
    }

    fn load(&mut self, st: &mut State, reg: u8, base: Reg, off: i64, size: u32) -> R<Reg> {
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + off, off_max + off);
                let bits = off_bits.plus(Tnum::konst(off as u64));
                match region {
                    Region::Ctx => {
                        Self::ctx_unmodified(reg, off_min, off_max)?;
                        self.ctx_access(lo, size, false)?;
                        // Aligned and at most 8 bytes (ctx_access): inside one word.
                        self.stats.ctx_words_read |= 1u64.checked_shl((lo / 8) as u32).unwrap_or(0);
                        self.stats.ctx_read_end =
                            self.stats.ctx_read_end.max((lo + size as i64) as u32);
                        Ok(unknown_bytes(size))
                    }
                    Region::Stack { frame } => {
                        Self::stack_aligned(lo, bits, size)?;
                        self.stack_read(st, frame, lo, hi, size)
                    }
                    _ => {
                        self.gpu_aligned(lo, bits, size)?;
                        Self::region_bounds(region, lo, hi, size as u64)?;
                        Ok(unknown_bytes(size))
                    }
                }
            }
            p => Err(Self::not_memory(reg, &p)),
        }
    }

    fn store(
        &mut self,
        st: &mut State,
        reg: u8,
        base: Reg,
        off: i64,
        size: u32,
        val: Reg,
    ) -> R<()> {
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + off, off_max + off);
                let bits = off_bits.plus(Tnum::konst(off as u64));
                match region {
                    Region::Ctx => {
                        Self::ctx_unmodified(reg, off_min, off_max)?;
                        self.ctx_access(lo, size, true)
                    }
                    Region::Stack { frame } => {
                        Self::stack_aligned(lo, bits, size)?;
                        if val.is_pointer() && size != 8 {
                            return Err(RejectKind::PartialPointerSpill { size });
                        }
                        // As in the kernel: a stack address never goes into another
                        // frame's stack, where it could outlive its frame.
                        let stack_ptr = matches!(
                            val,
                            Reg::Ptr {
                                region: Region::Stack { .. },
                                ..
                            }
                        );
                        if stack_ptr && frame as usize + 1 != st.frames.len() {
                            return Err(RejectKind::StackPointerToCallerFrame);
                        }
                        self.stack_write(st, frame, lo, hi, size, Some(val))
                    }
                    _ => {
                        self.gpu_aligned(lo, bits, size)?;
                        Self::region_bounds(region, lo, hi, size as u64)
                    }
                }
            }
            p => Err(Self::not_memory(reg, &p)),
        }
    }

    fn atomic(&mut self, st: &mut State, i: &Insn, base: Reg, size: u32) -> R<()> {
        let base_op = i.imm & !op::FETCH;
        let valid_op = matches!(i.imm, op::ATOMIC_XCHG | op::ATOMIC_CMPXCHG)
            || matches!(
                base_op,
                op::ATOMIC_ADD | op::ATOMIC_OR | op::ATOMIC_AND | op::ATOMIC_XOR
            );
        if !valid_op || !(size == 4 || size == 8) {
            return Err(RejectKind::InvalidAtomic { imm: i.imm, size });
        }
        // A pointer operand leaks an address into memory, which privileged
        // programs may do; it only has to be initialized.
        Self::read(st, i.src)?;
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::read(st, 0)?;
        }
        let mut old = unknown_bytes(size);
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + i.off as i64, off_max + i.off as i64);
                let bits = off_bits.plus(Tnum::konst(i.off as i64 as u64));
                // Atomics need natural alignment on every target; on the stack
                // every possible offset must be aligned, as for other accesses.
                if lo == hi && lo % size as i64 != 0 {
                    return Err(RejectKind::MisalignedAccess { off: lo, size });
                }
                if matches!(region, Region::Stack { .. }) {
                    Self::stack_aligned(lo, bits, size)?;
                }
                match region {
                    Region::Ctx => return Err(RejectKind::CtxAccess { off: lo, size }),
                    Region::Stack { frame } => {
                        // The fetch returns what the slot held (a spilled pointer
                        // too); what the slot holds after is some number.
                        old = self.stack_read(st, frame, lo, hi, size)?;
                        self.stack_write(st, frame, lo, hi, size, None)?;
                    }
                    _ => Self::region_bounds(region, lo, hi, size as u64)?,
                }
            }
            p => return Err(Self::not_memory(i.dst, &p)),
        }
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::write(st, 0, old)?;
        } else if i.imm & op::FETCH != 0 {
            Self::write(st, i.src, old)?;
        }
        Ok(())
    }

    fn note_depth(&mut self, st: &State, frame: u8, lo: i64) -> R<()> {
        let sp = st.frames[frame as usize].subprog;
        let d = (-lo) as u32;
        let e = self.depth.entry(sp).or_insert(0);
        if d > *e {
            *e = d;
        }
        Ok(())
    }

    /// Whether the frames of a call chain share one stack of
    /// [`uapi::STACK_SIZE`] bytes, which the kernel checks after verification.
    ///
    /// 6.13 brought private stacks (x86-64 JIT): a subprogram whose frame is 64
    /// bytes or more gets its own, checked alone, unless some subprogram
    /// tail-calls; 6.13's rule gives them to every kprobe program. On 6.18 (seen
    /// on 6.18.44) only perf_event programs and kprobe programs of the
    /// kprobe_multi and kprobe_session attach types get them; plain kprobe
    /// programs (kprobes and uprobes), uprobe_multi, tracepoint and
    /// raw_tracepoint programs do not. 6.1 has none. A `KPROBE` program here has
    /// no attach type, so its frames share the stack, as 6.1 and 6.18 require.
    /// Our own engines give each frame its own stack, so the conformance type is
    /// bound only where a tail call keeps the callers' frames.
    fn frames_share_stack(&self) -> bool {
        self.p.prog_type != PROG_TYPE_CONFORMANCE || self.has_tail_call
    }

    /// The kernel's stack check over the call graph: from the main program,
    /// through every bpf-to-bpf call and callback reference, in instruction
    /// order, each subprogram's deepest use (rounded as
    /// [`Self::rounded_frame`] says) is added to its callers'; the first chain
    /// over [`uapi::STACK_SIZE`] is refused. A subprogram that tail-calls must be
    /// reached with its callers' frames below 256 bytes: a tail call keeps them
    /// while the next program adds its own, up to 33 times.
    fn check_stack_chains(&self) -> Result<(), Rejection> {
        if !self.frames_share_stack() {
            return Ok(());
        }
        let insns = self.p.insns;
        let target = |pc: usize| {
            let i = &insns[pc];
            let call = i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO;
            let func = i.is_lddw() && i.src == op::PSEUDO_FUNC;
            (call || func).then(|| (pc as i64 + i.imm as i64 + 1) as usize)
        };
        let mut starts = vec![0usize];
        let mut pc = 0;
        while pc < insns.len() {
            starts.extend(target(pc));
            pc += if insns[pc].is_lddw() { 2 } else { 1 };
        }
        starts.sort_unstable();
        starts.dedup();
        // The calls each subprogram makes, in instruction order.
        let mut calls: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (n, &start) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(insns.len());
            let mut pc = start;
            let out = calls.entry(start).or_default();
            while pc < end {
                if let Some(t) = target(pc) {
                    out.push((pc, t));
                }
                pc += if insns[pc].is_lddw() { 2 } else { 1 };
            }
        }
        let tail_calls = |start: usize| {
            let n = starts.partition_point(|&s| s <= start);
            let end = starts.get(n).copied().unwrap_or(insns.len());
            insns[start..end].iter().any(|i| {
                i.code == op::CALL_INSN && i.src == op::CALL_HELPER && i.imm == h::TAIL_CALL as i32
            })
        };
        // (subprogram, the call that entered it, callers' bytes, frames) per chain.
        let mut work = vec![(0usize, 0usize, 0u32, 1usize)];
        let fail = |at: usize, kind: RejectKind| Rejection {
            insn: at,
            kind,
            disasm: Box::default(),
            regs: Vec::new(),
            verbose: self.log.clone().into(),
            source_line: None,
        };
        while let Some((sp, at, below, frames)) = work.pop() {
            if frames > uapi::MAX_CALL_FRAMES {
                return Err(fail(at, RejectKind::CallStackTooDeep { frames }));
            }
            if sp != 0 && below >= 256 && tail_calls(sp) {
                return Err(fail(at, RejectKind::TailCallStackTooLarge { depth: below }));
            }
            let depth = below + Self::rounded_frame(self.depth.get(&sp).copied().unwrap_or(0));
            if depth as usize > uapi::STACK_SIZE {
                return Err(fail(
                    at,
                    RejectKind::CombinedStackTooLarge { frames, depth },
                ));
            }
            // Reversed onto the stack, so the first call is walked first.
            for &(call, t) in calls.get(&sp).into_iter().flatten().rev() {
                work.push((t, call, depth, frames + 1));
            }
        }
        Ok(())
    }

    /// A frame's share of the stack: its deepest use rounded up to 32 bytes, and
    /// 32 for a frame that uses none. 6.1 rounds so, and so do later kernels
    /// for a program they interpret; 6.8+ round a JIT-compiled program's frames
    /// to 16 bytes (none for none). The coarser rounding refuses every chain
    /// either refuses.
    fn rounded_frame(depth: u32) -> u32 {
        depth.max(1).div_ceil(32) * 32
    }

    /// GPU loads and stores fault when misaligned (x86 does not care): every
    /// offset the pointer may hold must be aligned.
    fn gpu_aligned(&self, lo: i64, bits: Tnum, size: u32) -> R<()> {
        if self.p.gpu && !bits.aligned(size as u64) {
            return Err(RejectKind::MisalignedAccess { off: lo, size });
        }
        Ok(())
    }

    /// The kernel requires aligned stack accesses (its spill tracking relies on it),
    /// for every offset a variable pointer may hold; so do GPUs for every access.
    fn stack_aligned(lo: i64, bits: Tnum, size: u32) -> R<()> {
        if !bits.aligned(size as u64) {
            return Err(RejectKind::MisalignedStackAccess { off: lo, size });
        }
        Ok(())
    }

    fn stack_bounds(lo: i64, hi: i64, size: u64) -> R<()> {
        if lo < -(uapi::STACK_SIZE as i64) || hi + size as i64 > 0 || size == 0 {
            let off = if lo < -(uapi::STACK_SIZE as i64) {
                lo
            } else {
                hi
            };
            return Err(RejectKind::StackOutOfBounds { off, size });
        }
        Ok(())
    }

    /// Reads `size` bytes at `[lo, hi]` (a range when the offset is variable).
    fn stack_read(&mut self, st: &mut State, frame: u8, lo: i64, hi: i64, size: u32) -> R<Reg> {
        Self::stack_bounds(lo, hi, size as u64)?;
        self.note_depth(st, frame, lo)?;
        let f = &st.frames[frame as usize];
        if lo == hi && lo % size as i64 == 0 {
            // A fill of exactly what was spilled gets the register back.
            let (k, b) = Frame::locate(lo);
            let slot = f.slot(k);
            let exact = slot
                .bytes
                .iter()
                .enumerate()
                .all(|(i, x)| (*x == Byte::Spill) == (i >= b && i < b + size as usize));
            if let (Some(r), true) = (slot.spill, exact) {
                return Ok(r);
            }
            // A narrower fill of a spilled number's low bytes (its first bytes,
            // little-endian) keeps what is known of them.
            let first = slot.bytes.iter().position(|x| *x == Byte::Spill);
            let spilled = slot.bytes.iter().filter(|x| **x == Byte::Spill).count();
            if let (Some(Reg::Scalar { s, .. }), Some(first)) = (slot.spill, first) {
                if first == b && size as usize <= spilled {
                    let fits = size == 8 || s.umax < 1u64 << (size * 8);
                    return Ok(Reg::scalar(if fits {
                        s
                    } else {
                        Scalar::from_tnum(s.tnum.cast(size))
                    }));
                }
            }
        }
        let mut all_zero = true;
        for a in lo..hi + size as i64 {
            let (k, b) = Frame::locate(a);
            let slot = f.slot(k);
            match slot.bytes[b] {
                // Privileged programs may read stack bytes never written (the kernel
                // allows it with CAP_PERFMON): they are some number.
                Byte::Invalid | Byte::Misc => all_zero = false,
                Byte::Spill => {
                    if lo == hi && !matches!(slot.spill, Some(Reg::Scalar { .. })) {
                        return Err(RejectKind::PartialSpillRead { off: lo, size });
                    }
                    if slot
                        .spill
                        .and_then(|r| r.as_scalar())
                        .and_then(|s| s.as_const())
                        != Some(0)
                    {
                        all_zero = false;
                    }
                }
                Byte::Zero => {}
            }
        }
        Ok(if all_zero {
            Reg::konst(0)
        } else {
            unknown_bytes(size)
        })
    }

    /// Writes `size` bytes at `[lo, hi]`; `val` is the register stored (`None` for
    /// helper writes, which leave unknown scalar data).
    fn stack_write(
        &mut self,
        st: &mut State,
        frame: u8,
        lo: i64,
        hi: i64,
        size: u32,
        val: Option<Reg>,
    ) -> R<()> {
        Self::stack_bounds(lo, hi, size as u64)?;
        self.note_depth(st, frame, lo)?;
        let f = &mut st.frames[frame as usize];
        if lo == hi && size == 8 && lo % 8 == 0 {
            if let Some(v) = val {
                *f.slot_mut(Frame::locate(lo).0) = Slot {
                    bytes: [Byte::Spill; 8],
                    spill: Some(v),
                };
                return Ok(());
            }
        }
        let zero =
            lo == hi && val.and_then(|v| v.as_scalar()).and_then(|s| s.as_const()) == Some(0);
        for a in lo..hi + size as i64 {
            let (k, b) = Frame::locate(a);
            let slot = f.slot_mut(k);
            if slot.bytes[b] == Byte::Spill {
                unspill(slot);
            }
            slot.bytes[b] = if zero { Byte::Zero } else { Byte::Misc };
        }
        // A narrow aligned store of a scalar keeps its bounds for a fill of the same
        // size (clang spills u32s under register pressure).
        if let (Some(Reg::Scalar { s, id }), true) =
            (val, lo == hi && size < 8 && lo % size as i64 == 0)
        {
            if !zero {
                let fits = s.umax < 1u64 << (size * 8);
                let kept = if fits {
                    Reg::Scalar { s, id }
                } else {
                    Reg::scalar(Scalar::from_tnum(s.tnum.cast(size)))
                };
                let (k, b) = Frame::locate(lo);
                let slot = f.slot_mut(k);
                unspill(slot);
                slot.bytes[b..b + size as usize].fill(Byte::Spill);
                slot.spill = Some(kept);
            }
        }
        Ok(())
    }

    /// A helper reads or writes `[ptr, ptr + size)` for sizes `size_min..=size_max`.
    fn helper_mem(&mut self, st: &mut State, reg: u8, p: Reg, size_max: u64, write: bool) -> R<()> {
        if size_max == 0 {
            // Even an empty stack range must start inside the frame, as the
            // kernel requires.
            if let Reg::Ptr {
                region: Region::Stack { .. },
                off_min,
                off_max,
                ..
            } = p
            {
                if off_min < -(uapi::STACK_SIZE as i64) || off_min > -1 || off_max > 0 {
                    return Err(RejectKind::StackOutOfBounds {
                        off: off_min,
                        size: 0,
                    });
                }
            }
            return Ok(());
        }
        match p {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                ..
            } => match region {
                Region::Ctx => Err(RejectKind::HelperArgType {
                    reg,
                    found: "ctx",
                    expected: "pointer to stack or map value",
                }),
                Region::Stack { frame } => {
                    Self::stack_bounds(off_min, off_max, size_max)?;
                    if write {
                        self.stack_write(st, frame, off_min, off_max, size_max as u32, None)
                    } else {
                        // Bytes never written are readable, as for direct loads.
                        self.note_depth(st, frame, off_min)
                    }
                }
                _ => Self::region_bounds(region, off_min, off_max, size_max),
            },
            _ => Err(RejectKind::HelperArgType {
                reg,
                found: p.type_name(),
                expected: "pointer to memory",
            }),
        }
    }

    /// The string a constant-string argument points to (its bytes before the NUL), once
    /// it is shown to be one as the kernel shows it: a constant offset into the value of
    /// a frozen array of one element that programs cannot write, with a NUL in it.
    fn const_str(&mut self, reg: u8, p: Reg) -> R<Vec<u8>> {
        let Reg::Ptr {
            region: region @ Region::MapValue { fd, size },
            nullable: false,
            off_min,
            off_max,
            ..
        } = p
        else {
            return Err(RejectKind::HelperArgType {
                reg,
                found: p.type_name(),
                expected: "map_value",
            });
        };
        let m = self.map(fd)?;
        if m.flags & map_flags::RDONLY_PROG == 0 || !m.frozen {
            return Err(RejectKind::NotReadonlyMap { reg });
        }
        if off_min != off_max {
            return Err(RejectKind::NotConstantAddress { reg });
        }
        if !matches!(m.map_type, mt::ARRAY | mt::GPU_ARRAY) {
            return Err(RejectKind::NoDirectValueAccess);
        }
        // The string may run to the value's end; an offset at or past the end (or
        // before the start) reads nothing, which is out of bounds too.
        let rest = (i64::from(size) - off_min).max(1) as u64;
        Self::region_bounds(region, off_min, off_max, rest)?;
        // Only an array of one element has one address for its value; the loader
        // gives the bytes of those alone.
        let value = match &m.frozen_value {
            Some(v) if m.max_entries == 1 => v,
            _ => return Err(RejectKind::DirectValueAccessFailed),
        };
        let tail = value.get(off_min as usize..).unwrap_or_default();
        let nul = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or(RejectKind::StringNotTerminated)?;
        Ok(tail[..nul].to_vec())
    }

    /// `bpf_snprintf`'s format, checked at load for the arguments `data_len` (r5)
    /// holds. The count comes from r5's known bits even when r5 is not a constant,
    /// as the kernel takes it: a range the program narrows counts as its known bits.
    fn snprintf_format(&self, st: &State, fmt: &[u8]) -> R<()> {
        let len = st.cur().regs[5].as_scalar().map_or(0, |s| s.tnum.value);
        if !len.is_multiple_of(8) {
            return Err(RejectKind::SnprintfDataLen { len });
        }
        bprintf::parse(fmt, (len / 8) as usize)
            .map(|_| ())
            .map_err(|error| RejectKind::InvalidFormat { error })
    }

    // ---- jumps and calls ---------------------------------------------------

    fn jump(&mut self, st: &mut State, i: &Insn, pc: usize) -> R<Flow> {
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

    fn exit(&mut self, st: &mut State) -> R<Flow> {
        // A callee may return nothing (a void function); only its caller's read of
        // r0 must find a value.
        let r0 = match st.cur().kind {
            FrameKind::Call { .. } => st.cur().regs[0],
            _ => Self::read(st, 0)?,
        };
        let depth = st.frames.len() - 1;
        match st.cur().kind {
            // The return value of a probe is ignored; privileged programs may
            // return a pointer, so r0 only has to be initialized.
            FrameKind::Main => {
                if let Some(&(ref_id, alloc_insn)) = st.refs.first() {
                    return Err(RejectKind::UnreleasedReference { ref_id, alloc_insn });
                }
                Ok(Flow::End)
            }
            FrameKind::Call { ret } => {
                if matches!(r0, Reg::Ptr { region: Region::Stack { frame }, .. } if frame as usize == depth)
                {
                    return Err(RejectKind::ReturnStackPointer);
                }
                st.frames.pop();
                forget_frame(st, depth);
                let f = st.cur_mut();
                f.regs[0] = r0;
                f.regs[1..6].fill(Reg::Uninit);
                Ok(Flow::Goto(ret))
            }
            FrameKind::Loop { call, ctx } => {
                let Some(s) = r0.as_scalar() else {
                    return Err(RejectKind::ReturnNotScalar { ty: r0.type_name() });
                };
                if s.umax > 1 {
                    return Err(RejectKind::CallbackReturnRange {
                        umin: s.umin,
                        umax: s.umax,
                    });
                }
                // Either another iteration runs, or the loop ends and the helper returns.
                let sp = st.cur().subprog;
                let invocation = st.cur().invocation;
                let iteration = st.cur().iteration + 1;
                st.frames.pop();
                forget_frame(st, depth);
                let mut again = st.clone();
                again.frames.push(Self::callback_frame(
                    depth as u8,
                    call,
                    ctx,
                    sp,
                    invocation,
                    iteration,
                ));
                let f = st.cur_mut();
                f.regs[0] = Reg::unknown();
                f.regs[1..6].fill(Reg::Uninit);
                Ok(Flow::Fork(call + 1, again, sp))
            }
        }
    }

    fn callback_frame(
        depth: u8,
        call: usize,
        ctx: Reg,
        subprog: usize,
        invocation: u32,
        iteration: u32,
    ) -> Frame {
        let mut f = Frame::new(depth, FrameKind::Loop { call, ctx }, subprog);
        f.invocation = invocation;
        f.iteration = iteration;
        f.regs[1] = Reg::unknown();
        f.regs[2] = ctx;
        f
    }

    fn push_frame_check(&self, st: &State, target: usize) -> R<()> {
        if st.frames.len() >= uapi::MAX_CALL_FRAMES {
            return Err(RejectKind::CallStackTooDeep {
                frames: st.frames.len() + 1,
            });
        }
        if st.frames.iter().any(|f| f.subprog == target) {
            return Err(RejectKind::RecursiveCall { target });
        }
        Ok(())
    }

    fn call(&mut self, st: &mut State, pc: usize, target: usize) -> R<Flow> {
        self.push_frame_check(st, target)?;
        let depth = st.frames.len() as u8;
        let mut f = Frame::new(depth, FrameKind::Call { ret: pc + 1 }, target);
        f.regs[1..6].copy_from_slice(&st.cur().regs[1..6]);
        st.frames.push(f);
        Ok(Flow::Goto(target))
    }

    fn helper(&mut self, st: &mut State, id: i32, pc: usize) -> R<Flow> {
        let proto = u32::try_from(id)
            .ok()
            .and_then(helpers::proto)
            .ok_or(RejectKind::UnknownHelper { id })?;
        let uid = id as u32;
        if self.p.gpu && !proto.gpu {
            return Err(RejectKind::HelperNotOnGpu {
                id: uid,
                name: proto.name,
            });
        }
        if !self.p.gpu && !proto.cpu {
            return Err(RejectKind::HelperNotOnCpu {
                id: uid,
                name: proto.name,
            });
        }
        let mut map: Option<(i32, MapDesc)> = None;
        let mut pending_mem: Option<(u8, Reg, Arg)> = None;
        let mut reserve_size = 0u32;
        let mut callback = None;
        let mut const_key = None;
        let mut size_max = u64::MAX;
        let mut const_str = None;
        let mut null_ctx = None;
        for (n, arg) in proto.args.iter().enumerate() {
            let r = n as u8 + 1;
            let v = Self::read(st, r)?;
            if matches!(
                v,
                Reg::Ptr {
                    region: Region::Ctx,
                    ..
                }
            ) {
                self.stats.ctx_words_read = u64::MAX;
            }
            let wrong = |expected: &'static str| RejectKind::HelperArgType {
                reg: r,
                found: v.type_name(),
                expected,
            };
            match *arg {
                Arg::Anything => {}
                Arg::Scalar => {
                    if v.as_scalar().is_none() {
                        return Err(wrong("scalar"));
                    }
                }
                Arg::Map(types) => {
                    let Reg::MapPtr { fd } = v else {
                        return Err(wrong("map_ptr"));
                    };
                    let m = self.map(fd)?;
                    if !types.contains(&m.map_type) {
                        return Err(RejectKind::MapHelperMismatch {
                            map_type: m.map_type,
                            id: uid,
                            name: proto.name,
                        });
                    }
                    map = Some((fd, m));
                }
                Arg::MapKey | Arg::MapValue | Arg::MapValueOut => {
                    let (_, m) = map.as_ref().expect("prototypes name the map first");
                    let (size, write) = match *arg {
                        Arg::MapKey => (m.key_size, false),
                        Arg::MapValue => (m.value_size, false),
                        _ => (m.value_size, true),
                    };
                    if !matches!(
                        v,
                        Reg::Ptr {
                            nullable: false,
                            ..
                        }
                    ) {
                        return Err(wrong("pointer to stack or map value"));
                    }
                    self.helper_mem(st, r, v, size as u64, write)?;
                    // A per-thread array's lookup misses for threads past its count.
                    if *arg == Arg::MapKey
                        && matches!(mt::served_as(m.map_type), mt::ARRAY | mt::PERCPU_ARRAY)
                    {
                        const_key = const_stack_key(st, v, m.key_size);
                    }
                }
                Arg::Mem | Arg::MemOut | Arg::MemOrNull => pending_mem = Some((r, v, *arg)),
                Arg::MemOutFixed(size) => self.helper_mem(st, r, v, size as u64, true)?,
                Arg::Str => self.helper_mem(st, r, v, 1, false)?,
                Arg::ConstStr => const_str = Some(self.const_str(r, v)?),
                Arg::Size | Arg::SizeOrZero => {
                    let Some(s) = v.as_scalar() else {
                        return Err(wrong("scalar"));
                    };
                    if s.smin < 0 {
                        return Err(RejectKind::SizeNegative { reg: r });
                    }
                    if s.umax >= MAX_VAR_OFF as u64 {
                        return Err(RejectKind::SizeUnbounded { reg: r });
                    }
                    if *arg == Arg::Size && s.umin == 0 {
                        return Err(RejectKind::SizeZero { reg: r });
                    }
                    size_max = s.umax;
                    let (mr, mv, kind) = pending_mem
                        .take()
                        .expect("prototypes put the memory before its size");
                    let null = mv.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if kind == Arg::MemOrNull && null {
                        continue;
                    }
                    if s.umax == 0 && null {
                        continue;
                    }
                    if !matches!(
                        mv,
                        Reg::Ptr {
                            nullable: false,
                            ..
                        }
                    ) {
                        return Err(RejectKind::HelperArgType {
                            reg: mr,
                            found: mv.type_name(),
                            expected: "pointer to memory",
                        });
                    }
                    self.helper_mem(st, mr, mv, s.umax, kind == Arg::MemOut)?;
                }
                Arg::ConstSize => {
                    let c = v
                        .as_scalar()
                        .and_then(|s| s.as_const())
                        .ok_or(RejectKind::NotConstant { reg: r })?;
                    // Any constant: a reservation larger than the ring fails at
                    // run time (NULL), and no ring holds more than u32::MAX bytes.
                    reserve_size = c.min(u64::from(u32::MAX)) as u32;
                }
                Arg::Ctx => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if null && uid == h::PERF_EVENT_OUTPUT {
                        // bpftime's GPU programs pass NULL to bpf_perf_event_output on
                        // a GPU ring buffer (which has no use for it): allowed there
                        // alone, once the map argument shows which map it is.
                        null_ctx = Some(wrong("ctx"));
                    } else if !matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Ctx,
                            off_min: 0,
                            off_max: 0,
                            ..
                        }
                    ) {
                        return Err(wrong("ctx"));
                    }
                }
                Arg::RingbufRelease => {
                    let Reg::Ptr {
                        region: Region::Ringbuf { .. },
                        nullable: false,
                        off_min: 0,
                        off_max: 0,
                        ref_id,
                        ..
                    } = v
                    else {
                        return Err(RejectKind::BadRelease { reg: r });
                    };
                    if ref_id == 0 || !st.refs.iter().any(|(x, _)| *x == ref_id) {
                        return Err(RejectKind::BadRelease { reg: r });
                    }
                    release(st, ref_id);
                }
                Arg::TaskOrNull => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    let task = matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Task,
                            off_min: 0,
                            off_max: 0,
                            ..
                        }
                    );
                    if !null && !task {
                        return Err(wrong("ptr_task_struct"));
                    }
                }
                Arg::MapValueOrNull => {
                    let (_, m) = map.as_ref().expect("prototypes name the map first");
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if !null {
                        if !matches!(
                            v,
                            Reg::Ptr {
                                nullable: false,
                                ..
                            }
                        ) {
                            return Err(wrong("pointer to stack or map value"));
                        }
                        self.helper_mem(st, r, v, m.value_size as u64, false)?;
                    }
                }
                Arg::StackOrNull => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    let stack = matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Stack { .. },
                            nullable: false,
                            ..
                        }
                    );
                    if !null && !stack {
                        return Err(wrong("fp"));
                    }
                }
                Arg::Callback => {
                    let Reg::Func { pc } = v else {
                        return Err(wrong("func"));
                    };
                    callback = Some(pc);
                }
            }
        }
        if uid == h::SNPRINTF {
            let fmt = const_str.expect("bpf_snprintf's format is a constant string");
            self.snprintf_format(st, &fmt)?;
        }
        if let Some(refused) = null_ctx {
            if map
                .as_ref()
                .is_none_or(|(_, m)| m.map_type != mt::GPU_RINGBUF)
            {
                return Err(refused);
            }
        }
        let ctx_arg = st.cur().regs[3];
        // bpf_loop told to run no iteration never calls its callback (the kernel
        // does not look at the callback then either).
        let no_iterations =
            uid == h::LOOP && st.cur().regs[1].as_scalar().and_then(|s| s.as_const()) == Some(0);
        let r0 = match proto.ret {
            // These return how many bytes they wrote (at most the size they were
            // given) or a negative errno, which the kernel also knows.
            Ret::Integer if returns_length(uid) => Reg::scalar(
                Scalar {
                    smin: -MAX_ERRNO,
                    smax: size_max as i64,
                    ..Scalar::UNKNOWN
                }
                .normalized()
                .unwrap_or(Scalar::UNKNOWN),
            ),
            Ret::Integer => Reg::unknown(),
            Ret::Void => Reg::Uninit,
            Ret::MapValueOrNull
                if map.as_ref().is_some_and(|(_, m)| {
                    matches!(m.map_type, mt::ARRAY_OF_MAPS | mt::HASH_OF_MAPS)
                }) =>
            {
                // A lookup in a map of maps gives an inner map, or NULL: the program
                // may pass it to map helpers once it tested it, as in the kernel.
                let fd = map.as_ref().expect("lookup names a map").0;
                let inner = inner_map_key(fd);
                self.map(inner)?;
                Reg::Ptr {
                    region: Region::InnerMap { fd: inner },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: true,
                    id: self.fresh_id(),
                    ref_id: 0,
                }
            }
            Ret::MapValueOrNull => {
                let (fd, m) = map.as_ref().expect("lookup names a map");
                let fd = *fd;
                // An array lookup with a constant key in range cannot miss (the
                // kernel drops the null check there too).
                let hit = uid == h::MAP_LOOKUP_ELEM
                    && const_key.is_some_and(|k| k < u64::from(m.max_entries));
                let id = if hit { 0 } else { self.fresh_id() };
                Reg::Ptr {
                    region: Region::MapValue {
                        fd,
                        size: m.value_size,
                    },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: !hit,
                    id,
                    ref_id: 0,
                }
            }
            Ret::Task => Reg::ptr(Region::Task, 0),
            Ret::RingbufOrNull => {
                let id = self.fresh_id();
                st.refs.push((id, pc));
                Reg::Ptr {
                    region: Region::Ringbuf { size: reserve_size },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: true,
                    id,
                    ref_id: id,
                }
            }
        };
        let f = st.cur_mut();
        f.regs[1..6].fill(Reg::Uninit);
        f.regs[0] = r0;
        if uid == h::LOOP && !no_iterations {
            let target = callback.expect("bpf_loop takes a callback");
            self.push_frame_check(st, target)?;
            let mut inside = st.clone();
            let depth = inside.frames.len() as u8;
            let invocation = self.fresh_id();
            inside.frames.push(Self::callback_frame(
                depth, pc, ctx_arg, target, invocation, 0,
            ));
            // Zero iterations is one outcome; the callback running is the other.
            return Ok(Flow::Fork(pc + 1, inside, target));
        }
        Ok(Flow::Goto(pc + 1))
    }

    fn cond(&mut self, st: &mut State, i: &Insn, pc: usize) -> R<Flow> {
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
