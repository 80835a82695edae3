//! PTX modules: reading the kernels of an application's module and splicing probe calls
//! into them.
//!
//! One splicer serves every probe kind: [`Splice`] lists, per kernel, the probe functions
//! to call at each [`ProbePoint`], and [`PtxModule::splice`] writes the new module. A new
//! kind of probe (loads and stores, say) is a new `ProbePoint` and the code that finds its
//! sites, not a second splicer.
//!
//! What the splice does to a kernel:
//! - each probe is called with the kernel's first six parameters: scalars widened to 64
//!   bits (signed ones sign-extended), a parameter passed by value as an array (a struct)
//!   as the generic address of its bytes, 0 for missing ones ([`PROBE_ARGS`]). The probe
//!   lays them out as the kernel's `struct pt_regs` on x86-64 ([`CTX_SIZE`] bytes, the
//!   slots of `di`, `si`, `dx`, `cx`, `r8`, `r9` at [`ARG_OFFSETS`], the rest 0), so
//!   `PT_REGS_PARM1(ctx)`..`PT_REGS_PARM6(ctx)` read the kernel's arguments, and a probe
//!   that reads none of them costs no memory traffic.
//! - at entry, a call of each entry probe;
//! - before every `ret` and `exit` of the kernel's own body (predicated ones under the same
//!   predicate, labelled ones after their label, so jumps to the label run the probe too),
//!   a call of each exit probe.
//! - after every load, store, atomic and reduction in global memory (`ld.global`,
//!   `ldu.global`, `st.global`, `atom.global`, `red.global`, vector forms included, and the
//!   generic-address forms, whose calls run only when `isspacep.global` says the address
//!   is global, and the asynchronous copies from global into shared memory
//!   (`cp.async.ca.shared.global`, `.cg`), whose read of global memory is a load of the
//!   bytes it reads, and the tensor memory accelerator's one-dimensional bulk copies
//!   (`cp.async.bulk` between global and shared memory, `cp.reduce.async.bulk` into
//!   global memory), each one access of its whole size, a load, store or reduction of
//!   global memory by the thread that issues it (where the size is a register, the
//!   calls run one lane at a time: a probe takes a site's size to be the same across
//!   the warp); tensor copies (`cp.async.bulk.tensor`, tile mode), whose global memory
//!   is a box of the tensor its opaque map describes, an access per row of the box that
//!   lies in the tensor, the map found in the host's table of maps ([`TensorBox`]); L2
//!   prefetches are not accesses): a call of each access probe
//!   with six more arguments ([`ACCESS_ARGS`]):
//!   the address, the first 16 bytes of the value written (0 for loads), the size and kind
//!   ([`AccessKind`]), the kernel's id ([`kernel_id`]) with the access's index in the
//!   kernel, and the kernel parameter the address is computed from (found by following
//!   its register back, [`NO_BASE_ARG`] when that leads to no one parameter). Shared,
//!   local, constant and parameter memory are left out. The calls go after the access,
//!   and after the loads that follow it in the same straight run of arithmetic and loads
//!   (up to a statement that reads what they load), so that the loads are issued first,
//!   together, and the probes' work overlaps their wait; the address and value the calls
//!   pass are read from registers nothing in between writes. Where the access
//!   overwrites a register they are read from (`ld.global.u64 %rd1, [%rd1]`), the calls
//!   go before it.
//! - with shared-memory access probes (`cuda:KERNEL:ldst.shared`), a call of each at
//!   every access the above sees and every shared-memory one too (`ld.shared`,
//!   `st.shared`, `atom.shared`, `red.shared`, vector forms, and generic-address ones
//!   where `isspacep.shared` says the address is in the CTA's shared memory). The address
//!   is made generic (`cvta.shared`), so buffers can be told apart, and the context's
//!   space ([`AccessSpace`]) says which memory it is. A matrix load or store of 8x8
//!   16-bit matrices (`ldmatrix`, `stmatrix`) is a 16-byte row's access in each lane
//!   that names a row (the first 8, 16 or 32; the calls test `%laneid` for fewer than
//!   32). Local, constant and parameter memory are still left out.
//!
//! Everything else is kept as written: the directives between the parameter list and the
//! body (`.maxnreg`, `.maxntid`, `.reqntid`, `.minnctapersm`, ...), other kernels and
//! functions, debug sections. The probe functions go in front of the first definition, so
//! they are declared before any kernel calls them; their names must not clash with the
//! module's (the caller prefixes them).

use std::collections::HashMap;

use thiserror::Error;

use crate::inline::InlineBody;

/// Bytes of the probe context: `struct pt_regs` on x86-64.
pub const CTX_SIZE: usize = 168;

/// Offsets in `struct pt_regs` of the registers that carry the first six arguments on
/// x86-64: di, si, dx, cx, r8, r9.
pub const ARG_OFFSETS: [usize; 6] = [112, 104, 96, 88, 72, 64];

/// How many arguments an access probe gets after the kernel's six.
pub const ACCESS_ARGS: usize = 6;

/// Where an access probe's own arguments land in its `pt_regs`-shaped context, the slots
/// no kernel argument uses (`struct bpftime_gpu_access` of `bpf-examples/common/gpu_access.h`):
/// r15 the address, r14 and r13 the value's low and high 8 bytes, r12 the size (low 32
/// bits) and kind (high), bp the kernel id (low) and the access's index (high), bx the
/// kernel parameter the address is computed from ([`NO_BASE_ARG`] when not one alone).
pub const ACCESS_OFFSETS: [usize; ACCESS_ARGS] = [0, 8, 16, 24, 32, 40];

/// Which of an access probe's own arguments are the same in every lane of a warp that
/// makes the call: the size and kind, the kernel id and access index, and the base
/// argument are the call site's constants; the address and the value are the lane's.
pub const ACCESS_UNIFORM: [bool; ACCESS_ARGS] = [false, false, false, true, true, true];

/// An access's base argument when its address is not computed from one kernel pointer
/// parameter alone (or the splicer cannot tell): -1 as the context's 32-bit `arg`.
pub const NO_BASE_ARG: u32 = u32::MAX;

/// Which memory an access is in, as an access probe's context says it (bits 48..63 of
/// the size-and-kind argument: the high half of `kind`'s 32-bit slot in
/// `struct bpftime_gpu_access`, so global accesses read as they always did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AccessSpace {
    Global = 0,
    Shared = 1,
}

/// Where an access's address points, as the statement says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SiteSpace {
    Global,
    Shared,
    /// A generic address: global or shared (or other) at run time.
    Generic,
}

/// What a memory access does, as an access probe's context says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AccessKind {
    Load = 1,
    Store = 2,
    /// `atom`: reads and writes, returning the old value.
    Atomic = 3,
    /// `red`: an atomic update that returns nothing.
    Reduction = 4,
}

/// A kernel's id in access probes' contexts and launch contexts: FNV-1a over its mangled
/// name, so that a CPU program can name what a GPU program counted.
pub fn kernel_id(mangled: &str) -> u32 {
    crate::device_maps::hash_key(mangled.as_bytes())
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PtxError {
    #[error("the PTX module has no `.version` directive")]
    NoVersion,
    #[error("the PTX module has no `.target` directive")]
    NoTarget,
    #[error("PTX ends inside {0}")]
    Unterminated(&'static str),
    #[error("kernel `{kernel}`: cannot read its parameter list: {reason}")]
    BadParams { kernel: String, reason: String },
    #[error("no kernel `{0}` in the module")]
    NoSuchKernel(String),
    #[error("the module needs PTX ISA {needed}, newer than the {limit} the driver accepts")]
    VersionTooNew { needed: String, limit: String },
}

/// A PTX ISA version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Self {
        Version { major, minor }
    }

    /// The newest PTX ISA a driver of CUDA version `cuda` (as `cuDriverGetVersion`
    /// answers: 13000 for 13.0) accepts.
    pub fn newest_for_driver(cuda: i32) -> Version {
        let (major, minor) = (cuda / 1000, (cuda % 1000) / 10);
        match (major, minor) {
            (13.., _) => Version::new(9, minor.min(9) as u32),
            (12, m) => Version::new(8, m.min(9) as u32),
            (11, m) => Version::new(7, m.min(8) as u32),
            _ => Version::new(6, 0),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// How a kernel parameter is declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamType {
    /// `.u32`, `.s64`, `.f32`, `.b16`...: the type letter and the width in bits.
    Scalar { class: char, bits: u32 },
    /// `.align A .b8 name[N]`: a struct or array passed by value.
    Bytes { align: u32, len: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub ty: ParamType,
}

/// Where in a kernel an exit happens.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExitSite {
    /// The statement, from its predicate (or opcode) to its `;` inclusive.
    start: usize,
    end: usize,
    /// `@p` or `@!p`, as written.
    guard: Option<String>,
    /// `ret`, `ret.uni` or `exit`, as written.
    opcode: String,
}

/// A global or shared memory access in a kernel, with the PTX that computes its probe
/// arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AccessSite {
    /// Where the statement (its guard included) begins.
    start: usize,
    /// Where it ends (after its `;`).
    end: usize,
    /// Whether the probe calls go after the statement: the access is issued first, and
    /// the probe's work overlaps its wait (a load's value is not waited for, as the probe
    /// does not read it). Not where the access writes a register its address or value is
    /// read from (`ld.global.u64 %rd1, [%rd1]`): the calls go before it there.
    after: bool,
    /// Where calls that go after the statement go: its end, or the end of a later load
    /// of the same straight run of arithmetic and loads (see [`defer_calls`]).
    call_at: usize,
    /// The statement's place among the body's steps.
    step: usize,
    guard: Option<String>,
    /// A generic address: the calls run only where it is one of the spaces probed.
    space: SiteSpace,
    kind: AccessKind,
    /// Bytes accessed.
    size: u32,
    /// Where only the warp's first lanes access (a matrix load or store: each of the
    /// first 8, 16 or 32 lanes names one row), how many; `None` for every lane.
    lanes: Option<u32>,
    /// The 32-bit register holding the bytes accessed where that is not a constant (a
    /// bulk copy's), `size` then 0. A probe takes an access's size to be the same in
    /// every lane making the call, so such a site's probes run one lane at a time.
    size_reg: Option<String>,
    /// The kernel's registers the calls read (see [`defer_calls`]).
    reads: Vec<String>,
    /// PTX setting `%__bta6` to the (generic) address and `%__bta7`/`%__bta8` to the
    /// value written.
    prepare: String,
    /// The register the address is in, if any.
    base_reg: Option<String>,
    /// The kernel parameter (by position) every definition of `base_reg` comes from,
    /// through moves, conversions to global and additions of offsets: the buffer the
    /// access is in, for a kernel handed its buffers. Found once the body is read.
    base_arg: Option<usize>,
    /// A tensor copy's box, whose rows are the accesses (`prepare` and `size` unused).
    tensor: Option<TensorBox>,
}

/// A tensor copy (`cp.async.bulk.tensor`, `cp.reduce.async.bulk.tensor`, tile mode): its
/// tensor map and the box's first coordinates. The map is opaque, so the calls find what
/// it describes in the table of maps the host saw encoded ([`TENSOR_MAPS_GLOBAL`]), by its
/// 128 bytes; each row of the box that lies in the tensor (its first dimension clipped to
/// the tensor's bounds) is one access of the row's bytes, as the copy moves them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TensorBox {
    /// The 64-bit register holding the tensor map's generic address.
    map: String,
    /// One per dimension (the rank, 1 to 5): a 32-bit register or a number.
    coords: Vec<String>,
}

/// The module global the host points at its table of tensor maps ([`TENSOR_MAP_ENTRY`]
/// bytes an entry after a [`TENSOR_MAPS_HEAD`]-byte head whose first word is the count),
/// present in a spliced module whose access probes see tensor copies.
pub const TENSOR_MAPS_GLOBAL: &str = "__bpftime_tensor_maps";
/// Bytes before a tensor map table's first entry; its first 32 bits are the count.
pub const TENSOR_MAPS_HEAD: usize = 64;
/// Bytes of a tensor map table entry: the map's 128 bytes, then at 128 the global
/// address (u64), 136 the rank (u32), 140 the element size in bytes (u32), 144 the
/// dimensions (5 x u64, elements), 184 the strides (5 x u64, bytes; the first is the
/// element size), 224 the box (5 x u32, elements).
pub const TENSOR_MAP_ENTRY: usize = 256;

/// A kernel (`.entry`) with a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<Param>,
    /// Byte offset of the `.entry` directive (or the linkage before it) in the module.
    start: usize,
    /// The register limit its `.maxnreg` directive sets, if it has one.
    pub maxnreg: Option<u32>,
    /// Byte offsets of the body's `{` and its matching `}`.
    body_open: usize,
    body_close: usize,
    exits: Vec<ExitSite>,
    accesses: Vec<AccessSite>,
    /// Global (and generic) memory statements an access probe cannot see, with why (one
    /// line each).
    pub unseen_accesses: Vec<String>,
    /// Shared-memory statements a shared-memory access probe cannot see, with why.
    pub unseen_shared_accesses: Vec<String>,
}

impl Kernel {
    /// How many `ret`/`exit` statements end the kernel's body.
    pub fn exit_count(&self) -> usize {
        self.exits.len()
    }

    /// How many accesses (generic ones included) probes at `point` see, by kind.
    pub fn access_counts(&self, point: ProbePoint) -> Vec<(AccessKind, usize)> {
        let mut counts: Vec<(AccessKind, usize)> = Vec::new();
        for a in self.accesses.iter().filter(|a| point.sees(a.space)) {
            match counts.iter_mut().find(|c| c.0 == a.kind) {
                Some(c) => c.1 += 1,
                None => counts.push((a.kind, 1)),
            }
        }
        counts
    }

    /// The kind, size in bytes and space of the accesses probes at `point` see, in the
    /// order they are written.
    pub fn access_sizes(&self, point: ProbePoint) -> Vec<(AccessKind, u32, SiteSpace)> {
        self.accesses
            .iter()
            .filter(|a| point.sees(a.space))
            .map(|a| (a.kind, a.size, a.space))
            .collect()
    }

    /// Each access's base argument (the kernel parameter, by position, its address is
    /// computed from), in the order the probes at `point` number them.
    pub fn access_base_args(&self, point: ProbePoint) -> Vec<Option<usize>> {
        self.accesses
            .iter()
            .filter(|a| point.sees(a.space))
            .map(|a| a.base_arg)
            .collect()
    }
}

/// The probe points a splice can add a call at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbePoint {
    Entry,
    Exit,
    /// Every global load, store, atomic and reduction (`cuda:KERNEL:ldst`).
    Access,
    /// Those and every shared-memory one (`cuda:KERNEL:ldst.shared`).
    SharedAccess,
}

impl ProbePoint {
    /// How many `.param .b64` arguments the probe function takes.
    pub fn arg_count(self) -> usize {
        match self {
            ProbePoint::Entry | ProbePoint::Exit => PROBE_ARGS,
            ProbePoint::Access | ProbePoint::SharedAccess => PROBE_ARGS + ACCESS_ARGS,
        }
    }

    /// Whether probes at this point run at accesses written in `space`.
    pub fn sees(self, space: SiteSpace) -> bool {
        match self {
            ProbePoint::Entry | ProbePoint::Exit => false,
            ProbePoint::Access => space != SiteSpace::Shared,
            ProbePoint::SharedAccess => true,
        }
    }
}

/// A probe function to call in a kernel: `.func (.param .b64 r) symbol(.param .b64 a0, ..
/// .param .b64 a5)` (see [`PROBE_ARGS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeCall {
    pub point: ProbePoint,
    pub symbol: String,
}

/// What to splice into a module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Splice {
    /// PTX definitions (functions, globals) added to the module, without header
    /// directives; see [`strip_header`].
    pub definitions: String,
    /// The PTX ISA version and `sm_XY` target those definitions need.
    pub needs_version: Option<Version>,
    pub needs_sm: Option<u32>,
    /// The calls, per kernel name (as the module spells it).
    pub calls: Vec<(String, Vec<ProbeCall>)>,
    /// Put each probe's body in place of its calls where it can ([`crate::inline`]),
    /// rather than calling it.
    pub inline: bool,
}

/// A parsed PTX module.
#[derive(Debug, Clone)]
pub struct PtxModule {
    text: String,
    pub version: Version,
    /// The `sm_XY` of `.target`, as `XY`; `None` for a target without one.
    pub sm: Option<u32>,
    /// Byte range of the `.version` line's number, and of the `.target` line's value.
    version_span: (usize, usize),
    target_span: (usize, usize),
    /// Where definitions can go: after the header directives.
    header_end: usize,
    pub kernels: Vec<Kernel>,
    /// The module's own variables in global and constant memory (`__device__` and
    /// `__constant__`), in declaration order.
    pub variables: Vec<ModuleVariable>,
}

/// A variable the module defines in global or constant memory. An instrumented copy of
/// the module has its own; the application's values must reach it, and a kernel's writes
/// must reach the application's (`session`'s shared variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleVariable {
    pub name: String,
    /// `.const`: kernels only read it.
    pub constant: bool,
    /// Whether a function body of the module names it.
    pub used: bool,
}

/// A lexical token of PTX with its byte span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    /// Identifiers, directives, opcodes with their modifiers, numbers, registers.
    Word,
    Punct(u8),
    Str,
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%' | b'.')
}

impl Iterator for Lexer<'_> {
    type Item = Result<(Tok, usize, usize), PtxError>;

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.s;
        loop {
            while self.i < s.len() && s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
            if self.i >= s.len() {
                return None;
            }
            if s[self.i..].starts_with(b"//") {
                while self.i < s.len() && s[self.i] != b'\n' {
                    self.i += 1;
                }
                continue;
            }
            if s[self.i..].starts_with(b"/*") {
                match find(s, self.i + 2, b"*/") {
                    Some(end) => self.i = end + 2,
                    None => return Some(Err(PtxError::Unterminated("a comment"))),
                }
                continue;
            }
            break;
        }
        let start = self.i;
        let b = s[start];
        if b == b'"' {
            let mut j = start + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            if j >= s.len() {
                return Some(Err(PtxError::Unterminated("a string")));
            }
            self.i = j + 1;
            return Some(Ok((Tok::Str, start, self.i)));
        }
        if is_word_byte(b) {
            let mut j = start;
            while j < s.len() && is_word_byte(s[j]) {
                j += 1;
            }
            self.i = j;
            return Some(Ok((Tok::Word, start, j)));
        }
        self.i += 1;
        Some(Ok((Tok::Punct(b), start, start + 1)))
    }
}

fn find(s: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    s[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

fn tokens(text: &str) -> Result<Vec<(Tok, usize, usize)>, PtxError> {
    Lexer {
        s: text.as_bytes(),
        i: 0,
    }
    .collect()
}

/// The names of the kernels (`.entry`) a PTX module defines (a declaration, which ends at
/// a `;` before any body, is another module's kernel), without parsing their bodies: what
/// a search through many modules for one kernel needs.
pub fn entry_names(text: &str) -> Result<Vec<String>, PtxError> {
    let toks = tokens(text)?;
    let word = |i: usize| match toks.get(i) {
        Some(&(Tok::Word, a, b)) => Some(&text[a..b]),
        _ => None,
    };
    let defined = |i: usize| {
        toks[i..]
            .iter()
            .find(|t| matches!(t.0, Tok::Punct(b'{') | Tok::Punct(b';')))
            .is_some_and(|t| t.0 == Tok::Punct(b'{'))
    };
    Ok((0..toks.len())
        .filter(|&i| word(i) == Some(".entry") && defined(i))
        .filter_map(|i| word(i + 1).map(str::to_string))
        .collect())
}

impl PtxModule {
    pub fn parse(text: &str) -> Result<PtxModule, PtxError> {
        let toks = tokens(text)?;
        let mut version = None;
        let mut target = None;
        let mut header_end = 0;
        let mut kernels = Vec::new();
        let mut depth = 0usize;
        // Start of the current top-level declaration (its first token).
        let mut decl_start: Option<usize> = None;
        let mut k = 0;
        while k < toks.len() {
            let (tok, a, b) = toks[k];
            match tok {
                Tok::Punct(b'{') => depth += 1,
                Tok::Punct(b'}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        decl_start = None;
                    }
                }
                Tok::Punct(b';') if depth == 0 => decl_start = None,
                Tok::Word if depth == 0 => {
                    if decl_start.is_none() {
                        decl_start = Some(a);
                    }
                    match &text[a..b] {
                        ".version" => {
                            let (_, va, vb) = *toks.get(k + 1).ok_or(PtxError::NoVersion)?;
                            version = Some((parse_version(&text[va..vb])?, (va, vb)));
                            header_end = header_end.max(line_end(text, vb));
                            decl_start = None;
                        }
                        ".target" => {
                            // The value runs to the end of the line: `sm_90a, texmode_unified`.
                            let end = text[b..].find('\n').map_or(text.len(), |n| b + n);
                            let value = (
                                b + (text[b..end].len() - text[b..end].trim_start().len()),
                                end,
                            );
                            target = Some(value);
                            header_end = header_end.max(end);
                            decl_start = None;
                            // Skip the words of the value.
                            while k + 1 < toks.len() && toks[k + 1].1 < end {
                                k += 1;
                            }
                        }
                        ".address_size" => {
                            let (_, _, vb) = *toks.get(k + 1).ok_or(PtxError::NoTarget)?;
                            header_end = header_end.max(line_end(text, vb));
                            decl_start = None;
                            k += 1;
                        }
                        ".entry" => {
                            let start = decl_start.unwrap_or(a);
                            let (kernel, next) = parse_kernel(text, &toks, k, start)?;
                            if let Some(kernel) = kernel {
                                kernels.push(kernel);
                            }
                            decl_start = None;
                            k = next;
                            continue;
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
            k += 1;
        }
        let (version, version_span) = version.ok_or(PtxError::NoVersion)?;
        let target_span = target.ok_or(PtxError::NoTarget)?;
        let variables = module_variables(text, &toks, header_end);
        let sm = text[target_span.0..target_span.1]
            .split(',')
            .find_map(|t| t.trim().strip_prefix("sm_"))
            .and_then(|v| {
                v.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                    .parse()
                    .ok()
            });
        Ok(PtxModule {
            text: text.to_string(),
            version,
            sm,
            version_span,
            target_span,
            header_end,
            kernels,
            variables,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// The module with each `(kernel, cap)` of `caps` limited to `cap` registers a thread
    /// (`.maxnreg`, before its body); a kernel with a `.maxnreg` of its own keeps it.
    pub fn with_register_caps(&self, caps: &[(String, u32)]) -> Result<String, PtxError> {
        let mut edits = Vec::new();
        for (name, cap) in caps {
            let kernel = self
                .kernel(name)
                .ok_or_else(|| PtxError::NoSuchKernel(name.clone()))?;
            if kernel.maxnreg.is_none() {
                edits.push((kernel.body_open, format!(".maxnreg {cap}\n")));
            }
        }
        edits.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut out = self.text.clone();
        for (at, inserted) in edits {
            out.insert_str(at, &inserted);
        }
        Ok(out)
    }

    /// Writes the module with `splice` applied. `driver_limit` is the newest PTX ISA the
    /// driver accepts: the module's `.version` is raised to what the definitions need, never
    /// past it.
    pub fn splice(&self, splice: &Splice, driver_limit: Version) -> Result<String, PtxError> {
        for (name, _) in &splice.calls {
            if self.kernel(name).is_none() {
                return Err(PtxError::NoSuchKernel(name.clone()));
            }
        }
        let version = splice
            .needs_version
            .map_or(self.version, |v| v.max(self.version));
        if version > driver_limit {
            return Err(PtxError::VersionTooNew {
                needed: version.to_string(),
                limit: driver_limit.to_string(),
            });
        }
        // (offset, bytes removed, text inserted), applied back to front.
        let mut edits: Vec<(usize, usize, String)> = Vec::new();
        if version != self.version {
            let (a, b) = self.version_span;
            edits.push((a, b - a, version.to_string()));
        }
        if let (Some(need), Some(have)) = (splice.needs_sm, self.sm) {
            if need > have {
                let (a, b) = self.target_span;
                let rest: Vec<&str> = self.text[a..b]
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.starts_with("sm_"))
                    .collect();
                let mut value = format!("sm_{need}");
                for r in rest {
                    value.push_str(", ");
                    value.push_str(r);
                }
                edits.push((a, b - a, value));
            }
        }
        // Added definitions go before the first kernel or function.
        let definitions_at = self
            .kernels
            .iter()
            .map(|k| k.start)
            .min()
            .unwrap_or(self.text.len())
            .min(first_definition(&self.text, self.header_end));
        if !splice.definitions.is_empty() {
            edits.push((
                definitions_at,
                0,
                format!("\n// bpftime probes\n{}\n", splice.definitions.trim()),
            ));
        }
        // The table of tensor maps, where access probes see tensor copies.
        let tensor_copies = splice.calls.iter().any(|(name, calls)| {
            let kernel = self.kernel(name).expect("checked above");
            calls.iter().any(|c| c.point.sees(SiteSpace::Global))
                && kernel.accesses.iter().any(|a| a.tensor.is_some())
        });
        if tensor_copies {
            edits.push((
                definitions_at,
                0,
                format!("\n.visible .global .align 8 .u64 {TENSOR_MAPS_GLOBAL};\n"),
            ));
        }
        let bodies: HashMap<&str, InlineBody> = if splice.inline {
            splice
                .calls
                .iter()
                .flat_map(|(_, c)| c.iter().map(|c| c.symbol.as_str()))
                .filter_map(|s| Some((s, InlineBody::find(&splice.definitions, s)?)))
                .collect()
        } else {
            HashMap::new()
        };
        let (mut sites, mut budget) = (0, crate::inline::MODULE_INLINE_BUDGET);
        for (name, calls) in &splice.calls {
            let kernel = self.kernel(name).expect("checked above");
            edits.extend(kernel_edits(
                kernel,
                calls,
                &bodies,
                &mut sites,
                &mut budget,
            ));
        }
        edits.sort_by(|x, y| y.0.cmp(&x.0).then(y.1.cmp(&x.1)));
        let mut out = self.text.clone();
        for (at, removed, inserted) in edits {
            out.replace_range(at..at + removed, &inserted);
        }
        Ok(out)
    }
}

/// The variables declared at the top level (after the header, which ends at
/// `header_end`) in `.global` or `.const` space, not `.extern` (those are another
/// module's), with whether a function body names them.
fn module_variables(
    text: &str,
    toks: &[(Tok, usize, usize)],
    header_end: usize,
) -> Vec<ModuleVariable> {
    let mut found: Vec<ModuleVariable> = Vec::new();
    let mut depth = 0usize;
    // The top-level statement so far: its words, and whether it was cut by an initializer
    // (`= {...}`), after which words are values.
    let mut words: Vec<&str> = Vec::new();
    let mut initializer = false;
    // Every word written in a function body: a variable a body names is among them.
    let mut body_words: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let end_statement = |words: &mut Vec<&str>, found: &mut Vec<ModuleVariable>| {
        let space = |w: &str| words.contains(&w);
        if !space(".func") && !space(".entry") && !space(".extern") {
            let constant = space(".const");
            if constant || space(".global") {
                let name = words
                    .iter()
                    .find(|w| !w.starts_with('.') && !w.starts_with(|c: char| c.is_ascii_digit()));
                if let Some(name) = name {
                    found.push(ModuleVariable {
                        name: name.to_string(),
                        constant,
                        used: false,
                    });
                }
            }
        }
        words.clear();
    };
    let mut in_function = false;
    for &(tok, a, b) in toks.iter().filter(|t| t.1 >= header_end) {
        match tok {
            Tok::Punct(b'{') => {
                if depth == 0 && !initializer {
                    in_function = true;
                }
                depth += 1;
            }
            Tok::Punct(b'}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 && in_function {
                    in_function = false;
                    words.clear();
                }
            }
            Tok::Punct(b'=') if depth == 0 => initializer = true,
            Tok::Punct(b';') if depth == 0 => {
                end_statement(&mut words, &mut found);
                initializer = false;
            }
            Tok::Word if depth == 0 && !initializer => words.push(&text[a..b]),
            Tok::Word if in_function => {
                body_words.insert(&text[a..b]);
            }
            _ => {}
        }
    }
    for v in &mut found {
        v.used = body_words.contains(v.name.as_str());
    }
    found
}

fn line_end(text: &str, from: usize) -> usize {
    text[from..].find('\n').map_or(text.len(), |n| from + n)
}

/// The first byte after the header where a top-level declaration begins (a line that is
/// not blank, a comment, or a header directive); `header_end` when there is none.
fn first_definition(text: &str, header_end: usize) -> usize {
    let mut at = header_end;
    for line in text[header_end..].split_inclusive('\n') {
        let t = line.trim();
        if !(t.is_empty() || t.starts_with("//")) {
            return at;
        }
        at += line.len();
    }
    header_end
}

fn parse_version(v: &str) -> Result<Version, PtxError> {
    let (major, minor) = v.split_once('.').ok_or(PtxError::NoVersion)?;
    Ok(Version::new(
        major.parse().map_err(|_| PtxError::NoVersion)?,
        minor.parse().map_err(|_| PtxError::NoVersion)?,
    ))
}

/// Parses the `.entry` at token `k`; returns the kernel (none for a declaration without
/// a body) and the token index after it.
fn parse_kernel(
    text: &str,
    toks: &[(Tok, usize, usize)],
    k: usize,
    start: usize,
) -> Result<(Option<Kernel>, usize), PtxError> {
    let w = |i: usize| match toks.get(i) {
        Some(&(Tok::Word, a, b)) => Some(&text[a..b]),
        _ => None,
    };
    let name = w(k + 1)
        .ok_or(PtxError::Unterminated("a kernel's name"))?
        .to_string();
    let mut i = k + 2;
    let mut params = Vec::new();
    if matches!(toks.get(i), Some((Tok::Punct(b'('), _, _))) {
        let close = (i..toks.len())
            .find(|&j| matches!(toks[j].0, Tok::Punct(b')')))
            .ok_or(PtxError::Unterminated("a kernel's parameter list"))?;
        for decl in toks[i + 1..close].split(|t| matches!(t.0, Tok::Punct(b','))) {
            if decl.is_empty() {
                continue;
            }
            params.push(
                parse_param(text, decl).map_err(|reason| PtxError::BadParams {
                    kernel: name.clone(),
                    reason,
                })?,
            );
        }
        i = close + 1;
    }
    // Performance directives, then the body or a `;`.
    let mut maxnreg = None;
    while i < toks.len() && !matches!(toks[i].0, Tok::Punct(b'{') | Tok::Punct(b';')) {
        if w(i) == Some(".maxnreg") {
            maxnreg = w(i + 1).and_then(|n| n.parse().ok());
        }
        i += 1;
    }
    match toks.get(i) {
        Some(&(Tok::Punct(b';'), _, _)) => return Ok((None, i + 1)),
        None => return Err(PtxError::Unterminated("a kernel")),
        _ => {}
    }
    let body_open = toks[i].1;
    let mut depth = 0usize;
    let mut exits = Vec::new();
    let mut accesses = Vec::new();
    let mut unseen_accesses = Vec::new();
    let mut unseen_shared_accesses = Vec::new();
    let mut regs = Registers::default();
    let mut defs = Definitions::default();
    let mut vector = 0usize;
    let mut steps: Vec<Step> = Vec::new();
    // The current statement's first token (after any labels).
    let mut stmt: Option<usize> = None;
    let mut j = i;
    let body_close = loop {
        let Some(&(tok, a, _)) = toks.get(j) else {
            return Err(PtxError::Unterminated("a kernel's body"));
        };
        match tok {
            // Inside a statement, braces hold a vector operand: `{%f1, %f2}`.
            Tok::Punct(b'{') if stmt.is_some() => vector += 1,
            Tok::Punct(b'}') if vector > 0 => vector -= 1,
            Tok::Punct(b'{') => {
                depth += 1;
                stmt = None;
                steps.push(Step::Barrier);
            }
            Tok::Punct(b'}') => {
                depth -= 1;
                stmt = None;
                steps.push(Step::Barrier);
                if depth == 0 {
                    break a;
                }
            }
            Tok::Punct(b';') => {
                if let Some(s) = stmt.take() {
                    let statement = &toks[s..=j];
                    if let Some(site) = exit_site(text, statement) {
                        exits.push(site);
                        steps.push(Step::Barrier);
                    } else if regs.declare(text, statement) {
                        steps.push(Step::Barrier);
                    } else {
                        defs.take(text, statement);
                        match access_site(text, statement, &regs, &mut unseen_shared_accesses) {
                            Some(Ok(mut site)) => {
                                site.step = steps.len();
                                accesses.push(site);
                            }
                            Some(Err((SiteSpace::Shared, why))) => unseen_shared_accesses.push(why),
                            Some(Err((_, why))) => unseen_accesses.push(why),
                            None => {}
                        }
                        steps.push(Step::of(text, statement));
                    }
                }
            }
            // (Identifiers have no dots: `ld.global.L1::evict_last` is no label.)
            Tok::Punct(b':')
                if stmt
                    .is_some_and(|s| s + 1 == j && !text[toks[s].1..toks[s].2].contains('.')) =>
            {
                // `LABEL:` ends a label, not a statement.
                stmt = None;
                steps.push(Step::Barrier);
            }
            _ => {
                if stmt.is_none() {
                    stmt = Some(j);
                }
            }
        }
        j += 1;
    };
    for site in &mut accesses {
        site.base_arg = site
            .base_reg
            .as_deref()
            .and_then(|reg| defs.base_param(reg, &params));
    }
    defer_calls(&mut accesses, &steps);
    Ok((
        Some(Kernel {
            name,
            params,
            start,
            maxnreg,
            body_open,
            body_close,
            exits,
            accesses,
            unseen_accesses,
            unseen_shared_accesses,
        }),
        j + 1,
    ))
}

/// One step of a kernel body, in order, as the placing of access probes sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// A label, a brace, a declaration, or a statement a probe's calls are not moved
    /// past (a branch, a barrier, a store, an atomic, a call, an exit, ...).
    Barrier,
    /// Arithmetic or a load, which writes the registers named (its first operand's) and
    /// nothing else.
    Plain {
        end: usize,
        writes: Vec<String>,
        /// The registers its other operands and its guard name.
        reads: Vec<String>,
        /// A load of global (or generic) memory, whose wait is worth sharing.
        load: bool,
    },
}

/// Statements that write their first operand and have no other effect a probe call
/// could be ordered against.
const PLAIN_OPCODES: &[&str] = &[
    "ld", "ldu", "mov", "add", "sub", "mul", "mad", "mul24", "mad24", "cvt", "cvta", "shl", "shr",
    "and", "or", "xor", "not", "cnot", "setp", "selp", "set", "slct", "fma", "min", "max", "neg",
    "abs", "div", "rem", "sad", "popc", "clz", "bfe", "bfi", "bfind", "brev", "prmt", "lop3",
    "shf", "copysign", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh", "testp",
    "isspacep", "dp4a", "dp2a",
];

impl Step {
    fn of(text: &str, stmt: &[(Tok, usize, usize)]) -> Step {
        let Some(Statement {
            guard,
            opcode,
            operands,
            ..
        }) = statement(text, stmt)
        else {
            return Step::Barrier;
        };
        let pieces: Vec<&str> = opcode.split('.').collect();
        // `.cc` sets the carry flag a later `addc` reads, which calls would clobber.
        if !PLAIN_OPCODES.contains(&pieces[0]) || pieces.contains(&"cc") {
            return Step::Barrier;
        }
        let ops = split_operands(operands);
        let Some(&dest) = ops.first() else {
            return Step::Barrier;
        };
        let reads = ops[1..]
            .iter()
            .copied()
            .chain(guard.as_deref())
            .flat_map(registers_in)
            .map(str::to_string)
            .collect();
        // A load's destination is registers; `ld` into anything else is not one we know.
        if dest.contains('[') {
            return Step::Barrier;
        }
        let load = matches!(pieces[0], "ld" | "ldu")
            && !pieces.iter().any(|p| {
                ["shared", "local", "param", "const"]
                    .iter()
                    .any(|s| p.starts_with(s))
            });
        Step::Plain {
            end: stmt.last().map_or(0, |t| t.2),
            writes: registers_in(dest).into_iter().map(str::to_string).collect(),
            reads,
            load,
        }
    }
}

/// The most steps an access's calls are moved over, and the most loads.
const DEFER_STEPS: usize = 32;
const DEFER_LOADS: usize = 8;

/// Moves each access's calls (those that go after it) past the loads that follow it in
/// the same straight run of arithmetic and loads, up to the end of the last such load:
/// ptxas does not issue a load ahead of the probe's atomics, matches and calls, so left
/// after their own access the calls would hold back the next load (vectorAdd's load of
/// `b` waited for the probe of its load of `a`), where moved, the loads are all in flight
/// while the probes run. A call is not moved past a step that writes a register its
/// arguments are read from (the address, the value, the size, its guard), nor past
/// anything but arithmetic and loads, nor past one that reads what a load passed (or the
/// access itself) loads: that step waits for the load, and the calls are better run
/// during the wait than after it. Calls keep their accesses' order.
fn defer_calls(accesses: &mut [AccessSite], steps: &[Step]) {
    for i in (0..accesses.len()).rev() {
        let site = &accesses[i];
        if !site.after {
            continue;
        }
        let reads = &site.reads;
        let mut call_at = site.end;
        let mut loads = 0;
        // Registers loads in the window write.
        let mut loaded: Vec<&str> = match &steps[site.step] {
            Step::Plain { writes, .. } => writes.iter().map(String::as_str).collect(),
            Step::Barrier => Vec::new(),
        };
        for step in steps.iter().skip(site.step + 1).take(DEFER_STEPS) {
            let Step::Plain {
                end,
                writes,
                reads: step_reads,
                load,
            } = step
            else {
                break;
            };
            if writes.iter().any(|w| reads.contains(w))
                || step_reads.iter().any(|r| loaded.contains(&r.as_str()))
            {
                break;
            }
            if *load {
                loaded.extend(writes.iter().map(String::as_str));
                call_at = *end;
                loads += 1;
                if loads == DEFER_LOADS {
                    break;
                }
            }
        }
        // Never past a later access whose calls go before it or come earlier: the calls
        // stay in their accesses' order.
        for next in &accesses[i + 1..] {
            if next.start >= call_at {
                break;
            }
            let next_at = if next.after { next.call_at } else { next.start };
            call_at = call_at.min(next_at.max(site.end));
        }
        accesses[i].call_at = call_at;
    }
}

/// `ret`, `ret.uni` or `exit`, with an optional guard, as one statement's tokens (ending
/// with its `;`).
fn exit_site(text: &str, stmt: &[(Tok, usize, usize)]) -> Option<ExitSite> {
    let word = |t: &(Tok, usize, usize)| (t.0 == Tok::Word).then(|| &text[t.1..t.2]);
    let (guard, rest) = match stmt {
        [(Tok::Punct(b'@'), a, _), (Tok::Punct(b'!'), _, _), reg, rest @ ..] => {
            (Some((*a, reg.2)), rest)
        }
        [(Tok::Punct(b'@'), a, _), reg, rest @ ..] => (Some((*a, reg.2)), rest),
        _ => (None, stmt),
    };
    let [op, (Tok::Punct(b';'), _, end)] = rest else {
        return None;
    };
    let opcode = word(op)?;
    if !matches!(opcode, "ret" | "ret.uni" | "exit") {
        return None;
    }
    Some(ExitSite {
        start: stmt[0].1,
        end: *end,
        guard: guard.map(|(a, b)| text[a..b].split_whitespace().collect::<String>()),
        opcode: opcode.to_string(),
    })
}

/// The widths of a kernel's registers, from its `.reg` declarations (`.reg .b64 %rd<12>;`
/// declares `%rd0`..`%rd11`; `.reg .f32 %f, %g;` names them one by one).
#[derive(Debug, Default)]
struct Registers {
    /// `%rd` of `%rd<12>`, and its width.
    ranges: Vec<(String, u32)>,
    names: Vec<(String, u32)>,
}

impl Registers {
    /// Takes a `.reg` statement; false for any other.
    fn declare(&mut self, text: &str, stmt: &[(Tok, usize, usize)]) -> bool {
        let words: Vec<&str> = stmt
            .iter()
            .filter(|t| t.0 == Tok::Word)
            .map(|t| &text[t.1..t.2])
            .collect();
        if words.first() != Some(&".reg") {
            return false;
        }
        let bits = words
            .iter()
            .filter_map(|w| type_bits(w.strip_prefix('.')?))
            .next_back()
            .unwrap_or(if words.contains(&".pred") { 1 } else { 0 });
        let vector = words
            .iter()
            .find_map(|w| w.strip_prefix(".v")?.parse::<u32>().ok())
            .unwrap_or(1);
        let bits = bits * vector;
        for (n, t) in stmt.iter().enumerate() {
            if t.0 != Tok::Word || !text[t.1..t.2].starts_with('%') {
                continue;
            }
            let name = text[t.1..t.2].to_string();
            if matches!(stmt.get(n + 1), Some((Tok::Punct(b'<'), _, _))) {
                self.ranges.push((name, bits));
            } else {
                self.names.push((name, bits));
            }
        }
        true
    }

    /// The width in bits of register `name`, if it was declared.
    fn bits(&self, name: &str) -> Option<u32> {
        if let Some((_, b)) = self.names.iter().rev().find(|(n, _)| n == name) {
            return Some(*b);
        }
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        if prefix.len() == name.len() {
            return None;
        }
        self.ranges
            .iter()
            .rev()
            .find(|(n, _)| n == prefix)
            .map(|(_, b)| *b)
    }
}

/// The width in bits of a PTX type name without its dot (`u32`, `f16x2`, `b128`).
fn type_bits(t: &str) -> Option<u32> {
    match t {
        "f16x2" | "bf16x2" | "tf32" => return Some(32),
        "bf16" | "e4m3x2" | "e5m2x2" => return Some(16),
        _ => {}
    }
    let class = t.chars().next()?;
    if !matches!(class, 'u' | 's' | 'b' | 'f') {
        return None;
    }
    let bits: u32 = t[1..].parse().ok()?;
    matches!(bits, 8 | 16 | 32 | 64 | 128).then_some(bits)
}

/// Splits operands at the commas outside `[..]` and `{..}`.
fn split_operands(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    if !s[from..].trim().is_empty() {
        out.push(s[from..].trim());
    }
    out
}

/// One statement's parts: its guard (`@%p` or `@!%p`), and its text from the opcode to
/// before the `;`, whole and split at the first space into opcode and operands.
struct Statement<'t> {
    guard: Option<String>,
    text: &'t str,
    opcode: &'t str,
    operands: &'t str,
}

/// The parts of one statement's tokens (ending with its `;`).
fn statement<'t>(text: &'t str, stmt: &[(Tok, usize, usize)]) -> Option<Statement<'t>> {
    let (guard, op_at) = match stmt {
        [(Tok::Punct(b'@'), a, _), (Tok::Punct(b'!'), _, _), reg, op, ..] => (
            Some(text[*a..reg.2].split_whitespace().collect::<String>()),
            op.1,
        ),
        [(Tok::Punct(b'@'), a, _), reg, op, ..] => (Some(text[*a..reg.2].to_string()), op.1),
        [op, ..] => (None, op.1),
        [] => return None,
    };
    let end = stmt.last()?.1;
    let whole = text[op_at..end].trim();
    let (opcode, operands) = whole
        .split_once(|c: char| c.is_whitespace())
        .unwrap_or((whole, ""));
    Some(Statement {
        guard,
        text: whole,
        opcode,
        operands,
    })
}

/// Every register definition of a kernel's body (the statement's first operand), by
/// register: `(opcode, operands)`.
#[derive(Default)]
struct Definitions {
    by_register: HashMap<String, Vec<(String, Vec<String>)>>,
}

/// What tracing a register back finds: no parameter (an offset, a constant), exactly one,
/// or something else (a pointer loaded from memory, two parameters added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traced {
    Nothing,
    Param(usize),
    Unknown,
}

impl Traced {
    fn join(self, other: Traced) -> Traced {
        match (self, other) {
            (Traced::Nothing, t) | (t, Traced::Nothing) => t,
            (Traced::Param(a), Traced::Param(b)) if a == b => Traced::Param(a),
            _ => Traced::Unknown,
        }
    }
}

impl Definitions {
    /// Takes one statement's tokens (a guarded definition counts: it may happen).
    fn take(&mut self, text: &str, stmt: &[(Tok, usize, usize)]) {
        let Some(Statement {
            opcode, operands, ..
        }) = statement(text, stmt)
        else {
            return;
        };
        let ops: Vec<String> = split_operands(operands)
            .into_iter()
            .map(str::to_string)
            .collect();
        if let Some(dest) = ops.first().filter(|d| d.starts_with('%')) {
            self.by_register
                .entry(dest.clone())
                .or_default()
                .push((opcode.to_string(), ops.clone()));
        }
    }

    /// The position of the kernel parameter (of `params`) that `reg`'s value is a pointer
    /// into, when every definition of it comes from that one parameter's 64-bit value
    /// through moves, conversions to global, and additions (or subtractions) of values
    /// that come from no parameter.
    fn base_param(&self, reg: &str, params: &[Param]) -> Option<usize> {
        let mut visiting = Vec::new();
        match self.trace(reg, params, &mut visiting) {
            Traced::Param(i) => Some(i),
            _ => None,
        }
    }

    fn trace(&self, operand: &str, params: &[Param], visiting: &mut Vec<String>) -> Traced {
        if !operand.starts_with('%') {
            // An immediate: an offset.
            return if operand.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
                Traced::Nothing
            } else {
                Traced::Unknown
            };
        }
        // A loop's pointer advanced by itself: what enters the loop decides.
        if visiting.iter().any(|v| v == operand) || visiting.len() > 64 {
            return Traced::Nothing;
        }
        let Some(defs) = self.by_register.get(operand) else {
            return Traced::Unknown;
        };
        visiting.push(operand.to_string());
        let mut found = Traced::Nothing;
        for (opcode, ops) in defs {
            let pieces: Vec<&str> = opcode.split('.').collect();
            let wide = pieces.iter().any(|p| matches!(*p, "u64" | "s64" | "b64"));
            let from = |i: usize| ops.get(i).map(String::as_str).unwrap_or("");
            let traced = match pieces[0] {
                "ld" if pieces.contains(&"param") && wide => {
                    let name = from(1).trim_start_matches('[').trim_end_matches(']');
                    params
                        .iter()
                        .position(|p| p.name == name)
                        .map_or(Traced::Unknown, Traced::Param)
                }
                "mov" | "cvta" if wide => self.trace(from(1), params, visiting),
                "add" if wide => self.trace(from(1), params, visiting).join(self.trace(
                    from(2),
                    params,
                    visiting,
                )),
                "sub" if wide => match self.trace(from(2), params, visiting) {
                    Traced::Nothing => self.trace(from(1), params, visiting),
                    _ => Traced::Unknown,
                },
                "mad" if pieces.contains(&"wide") || wide => self.trace(from(3), params, visiting),
                // Offsets: products, shifts and widenings of indices.
                "mul" | "shl" | "cvt" => Traced::Nothing,
                _ => Traced::Unknown,
            };
            found = found.join(traced);
            if found == Traced::Unknown {
                break;
            }
        }
        visiting.pop();
        found
    }
}

/// A global or shared memory access (`Some(Ok)`), a memory statement probes cannot see
/// (`Some(Err((space, why)))`), or neither (`None`), from one statement's tokens. What a
/// shared-memory probe misses of it besides (an asynchronous copy's write) goes to
/// `missed_shared`.
fn access_site(
    text: &str,
    stmt: &[(Tok, usize, usize)],
    regs: &Registers,
    missed_shared: &mut Vec<String>,
) -> Option<Result<AccessSite, (SiteSpace, String)>> {
    let Statement {
        guard,
        text: statement,
        opcode,
        operands,
    } = statement(text, stmt)?;
    let pieces: Vec<&str> = opcode.split('.').collect();
    // An asynchronous copy from global into shared memory (`cp.async.ca.shared.global`,
    // `.cg`): its read of global memory is a load (its write into shared memory is said
    // to be missed, see `async_copy_shared_side`).
    let async_copy = is_async_copy(&pieces);
    if async_copy {
        // Its write lands when the thread waits for its group, not where it is issued.
        missed_shared.push(format!(
            "`{statement}`: the shared-memory write of an asynchronous copy is not probed \
             (its global read is)"
        ));
    }
    // A bulk copy between global and shared memory (the tensor memory accelerator's
    // one-dimensional `cp.async.bulk`, and `cp.reduce.async.bulk` into global memory):
    // one access of `size` bytes of global memory by the thread that issues it.
    let bulk = bulk_copy(&pieces);
    if let Some(BulkCopy::Copy { kind }) = bulk {
        let side = match kind {
            AccessKind::Load => "write",
            _ => "read",
        };
        missed_shared.push(format!(
            "`{statement}`: the shared-memory {side} of a bulk copy is not probed (its \
             global side is)"
        ));
    }
    // A matrix load or store of 8x8 16-bit elements (`ldmatrix`, `stmatrix`, .x1, .x2 or
    // .x4 matrices): each of the warp's first 8, 16 or 32 lanes names one 16-byte row,
    // which is that lane's access. Other shapes (sm_100's 8-bit ones) are said missed.
    let matrix = matches!(pieces[0], "ldmatrix" | "stmatrix")
        .then(|| {
            let count = pieces.iter().find_map(|p| match *p {
                "x1" => Some(1),
                "x2" => Some(2),
                "x4" => Some(4),
                _ => None,
            })?;
            (pieces.contains(&"m8n8") && pieces.contains(&"b16")).then_some(8 * count)
        })
        .flatten();
    let kind = match (bulk, pieces[0]) {
        (Some(BulkCopy::Copy { kind }), _) => kind,
        (Some(BulkCopy::Prefetch), _) => return None,
        (Some(BulkCopy::Tensor), _) => {
            return Some(
                tensor_site(stmt, &pieces, operands, guard, regs)
                    .map_err(|why| (SiteSpace::Global, format!("`{statement}`: {why}"))),
            )
        }
        _ if async_copy => AccessKind::Load,
        (_, "ld" | "ldu") => AccessKind::Load,
        (_, "st") => AccessKind::Store,
        (_, "ldmatrix") if matrix.is_some() => AccessKind::Load,
        (_, "stmatrix") if matrix.is_some() => AccessKind::Store,
        (_, "atom") => AccessKind::Atomic,
        (_, "red") => AccessKind::Reduction,
        // Shared memory that other matrix loads and stores (shared memory whether named or
        // generic) and other copies read or write: not single accesses a probe's context
        // can describe, so said to be missed.
        (_, "ldmatrix" | "stmatrix") => {
            return Some(Err((
                SiteSpace::Shared,
                format!("`{statement}`: this shape of {} is not probed", pieces[0]),
            )));
        }
        (_, "cp") if pieces.iter().any(|p| p.starts_with("shared")) => {
            return Some(Err((
                SiteSpace::Shared,
                format!("`{statement}`: a {} is not probed", pieces[0]),
            )));
        }
        _ => return None,
    };
    let space = |name: &str| pieces.iter().any(|p| p.starts_with(name));
    if ["local", "param", "const", "tex"].iter().any(|s| space(s)) {
        return None;
    }
    // `.shared::cluster` may be another CTA's memory, made generic its own way.
    let shared = pieces
        .iter()
        .find(|p| p.starts_with("shared"))
        .map(|p| match *p {
            "shared::cluster" => "shared::cluster",
            _ => "shared",
        });
    let site_space = match (shared, space("global")) {
        _ if async_copy || bulk.is_some() => SiteSpace::Global,
        (Some(_), _) => SiteSpace::Shared,
        (None, true) => SiteSpace::Global,
        (None, false) => SiteSpace::Generic,
    };
    let unseen = |why: &str| Some(Err((site_space, format!("`{statement}`: {why}"))));
    let ops = split_operands(operands);
    // Bytes accessed, and the bits of each lane of a value written.
    let mut size_reg = None;
    let (size, bits) = if matrix.is_some() {
        // A row; a lane's registers hold its share of the matrices, not its row's bytes,
        // so a store passes no value.
        (16, 0)
    } else if bulk.is_some() {
        // `size` bytes, a number or a 32-bit register read when the probe runs.
        match ops.get(2).map(|o| o.trim()) {
            Some(o) if o.starts_with('%') && regs.bits(o) == Some(32) => {
                size_reg = Some(o.to_string());
                (0, 0)
            }
            Some(o) => match parse_int(o).filter(|n| (1..=u32::MAX as i64).contains(n)) {
                Some(n) => (n as u32, 0),
                None => return unseen("no copy size"),
            },
            None => return unseen("no copy size"),
        }
    } else if async_copy {
        // `cp-size` bytes, or the `src-size` it reads where that is a number (the rest is
        // filled with zeros, not read).
        let Some(copied) = ops.get(2).and_then(|o| parse_int(o)).filter(|n| *n > 0) else {
            return unseen("no copy size");
        };
        let read = ops.get(3).and_then(|o| parse_int(o)).unwrap_or(copied);
        (read.clamp(0, copied) as u32, 0)
    } else {
        let bits = pieces
            .iter()
            .filter_map(|p| type_bits(p))
            .next_back()
            .unwrap_or(0);
        if bits == 0 {
            return unseen("no operand type");
        }
        let lanes = pieces
            .iter()
            .find_map(|p| p.strip_prefix('v')?.parse::<u32>().ok())
            .unwrap_or(1);
        ((bits * lanes).div_ceil(8), bits)
    };
    let (address, value) = match kind {
        _ if async_copy => (ops.get(1), None),
        // Global memory is the source of a copy into shared memory, else the destination.
        AccessKind::Load if bulk.is_some() => (ops.get(1), None),
        _ if bulk.is_some() => (ops.first(), None),
        AccessKind::Store if matrix.is_some() => (ops.first(), None),
        AccessKind::Load => (ops.get(1), None),
        AccessKind::Store | AccessKind::Reduction => (ops.first(), ops.get(1)),
        AccessKind::Atomic if pieces.contains(&"cas") => (ops.get(1), ops.get(3)),
        AccessKind::Atomic => (ops.get(1), ops.get(2)),
    };
    let Some(address) = address
        .and_then(|a| a.strip_prefix('['))
        .and_then(|a| a.strip_suffix(']'))
    else {
        return unseen("no address operand");
    };
    let mut prepare = String::new();
    let made_generic = match site_space {
        SiteSpace::Global => Some("global"),
        SiteSpace::Shared => shared,
        SiteSpace::Generic => None,
    };
    if let Err(why) = address_code(address, made_generic, regs, &mut prepare) {
        return unseen(&why);
    }
    prepare.push_str("mov.u64 %__bta7, 0;\nmov.u64 %__bta8, 0;\n");
    if let Some(value) = value {
        value_code(value, bits, regs, &mut prepare);
    }
    let base_reg = address
        .split('+')
        .next()
        .map(str::trim)
        .filter(|b| b.starts_with('%'))
        .map(str::to_string);
    let written = match kind {
        // A copy writes memory, never a register.
        _ if async_copy || bulk.is_some() => Vec::new(),
        AccessKind::Load | AccessKind::Atomic => {
            ops.first().map_or(Vec::new(), |d| registers_in(d))
        }
        AccessKind::Store | AccessKind::Reduction => Vec::new(),
    };
    let read: Vec<&str> = registers_in(address)
        .into_iter()
        .chain(value.map_or(Vec::new(), |v| registers_in(v)))
        .collect();
    // Everything the calls read of the kernel's registers: the address, the value, the
    // size, the guard.
    let reads = read
        .iter()
        .copied()
        .chain(guard.as_deref().map_or(Vec::new(), registers_in))
        .chain(size_reg.as_deref())
        .map(str::to_string)
        .collect();
    let end = stmt.last().map_or(stmt[0].2, |t| t.2);
    Some(Ok(AccessSite {
        start: stmt[0].1,
        end,
        call_at: end,
        step: 0,
        after: !written.iter().any(|w| read.contains(w)),
        guard,
        space: site_space,
        kind,
        size,
        lanes: matrix.filter(|&n| n < 32),
        size_reg,
        reads,
        prepare,
        base_reg,
        base_arg: None,
        tensor: None,
    }))
}

/// A tensor copy's site: a load of global memory into shared memory
/// (`cp.async.bulk.tensor.Nd.shared::cluster.global`), a store into global memory
/// (`cp.async.bulk.tensor.Nd.global.shared::cta`), or a reduction into it
/// (`cp.reduce.async.bulk.tensor`), in tile mode; the `im2col` modes are refused.
fn tensor_site(
    stmt: &[(Tok, usize, usize)],
    pieces: &[&str],
    operands: &str,
    guard: Option<String>,
    regs: &Registers,
) -> Result<AccessSite, String> {
    if pieces.iter().any(|p| p.starts_with("im2col")) {
        return Err("a tensor copy in im2col mode is not probed (only tile mode is)".into());
    }
    let rank = pieces
        .iter()
        .find_map(|p| p.strip_suffix('d')?.parse::<usize>().ok())
        .filter(|r| (1..=5).contains(r))
        .ok_or("a tensor copy without its dimensions (`.1d` to `.5d`)")?;
    let copy_dst = pieces
        .iter()
        .find(|p| p.starts_with("global") || p.starts_with("shared"));
    let kind = match (pieces[1], copy_dst) {
        ("reduce", _) => AccessKind::Reduction,
        (_, Some(p)) if p.starts_with("shared") => AccessKind::Load,
        _ => AccessKind::Store,
    };
    let ops = split_operands(operands);
    let tensor = match kind {
        AccessKind::Load => ops.get(1),
        _ => ops.first(),
    }
    .and_then(|o| o.strip_prefix('[')?.strip_suffix(']'))
    .ok_or("no tensor map operand")?;
    let (map, coords) = tensor
        .split_once(',')
        .ok_or("no coordinates after the tensor map")?;
    let map = map.trim();
    let coords: Vec<String> = coords
        .trim()
        .strip_prefix('{')
        .and_then(|c| c.strip_suffix('}'))
        .ok_or("no `{..}` coordinates")?
        .split(',')
        .map(|c| c.trim().to_string())
        .collect();
    if coords.len() != rank {
        return Err(format!("{} coordinates for a {rank}d copy", coords.len()));
    }
    for c in &coords {
        let fits = match c.starts_with('%') {
            true => regs.bits(c) == Some(32),
            false => parse_int(c).is_some(),
        };
        if !fits {
            return Err(format!(
                "coordinate `{c}` is not a 32-bit register or a number"
            ));
        }
    }
    if !map.starts_with('%') {
        return Err(format!(
            "a tensor map named by a variable (`{map}`) is not probed (one whose address is in \
             a register is)"
        ));
    }
    if regs.bits(map) != Some(64) {
        return Err(format!("tensor map register {map} is not 64-bit"));
    }
    let reads = registers_in(tensor)
        .into_iter()
        .chain(guard.as_deref().map_or(Vec::new(), registers_in))
        .map(str::to_string)
        .collect();
    let end = stmt.last().map_or(stmt[0].2, |t| t.2);
    Ok(AccessSite {
        start: stmt[0].1,
        end,
        call_at: end,
        step: 0,
        after: true,
        guard,
        space: SiteSpace::Global,
        kind,
        size: 0,
        lanes: None,
        size_reg: None,
        reads,
        prepare: String::new(),
        base_reg: None,
        base_arg: None,
        tensor: Some(TensorBox {
            map: map.to_string(),
            coords,
        }),
    })
}

/// What a bulk copy statement (`cp.async.bulk`, `cp.reduce.async.bulk`) with global
/// memory at one end is to a memory-access probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BulkCopy {
    /// A one-dimensional copy: a load of global memory into shared memory, a store of
    /// shared memory into global memory, or a reduction into global memory.
    Copy { kind: AccessKind },
    /// A copy of a tensor map's box, whose addresses the statement does not give.
    Tensor,
    /// A prefetch into the L2 cache, which reads nothing into the SM.
    Prefetch,
}

fn bulk_copy(pieces: &[&str]) -> Option<BulkCopy> {
    let copy = match pieces {
        ["cp", "async", "bulk", rest @ ..] => rest,
        ["cp", "reduce", "async", "bulk", rest @ ..] => rest,
        _ => return None,
    };
    if !copy.iter().any(|p| p.starts_with("global")) {
        return None;
    }
    if copy.contains(&"prefetch") {
        return Some(BulkCopy::Prefetch);
    }
    if copy.contains(&"tensor") {
        return Some(BulkCopy::Tensor);
    }
    // The destination's state space comes first.
    let kind = match (
        pieces[1],
        copy.iter()
            .find(|p| p.starts_with("global") || p.starts_with("shared")),
    ) {
        ("reduce", _) => AccessKind::Reduction,
        (_, Some(p)) if p.starts_with("shared") => AccessKind::Load,
        _ => AccessKind::Store,
    };
    Some(BulkCopy::Copy { kind })
}

/// Whether an opcode's pieces are those of an asynchronous copy from global into shared
/// memory, one thread's (`cp.async.ca.shared.global`, `cp.async.cg.shared::cta.global`),
/// not a bulk one.
fn is_async_copy(pieces: &[&str]) -> bool {
    pieces.len() > 2
        && pieces[0] == "cp"
        && pieces[1] == "async"
        && !pieces.contains(&"bulk")
        && pieces.iter().any(|p| p.starts_with("global"))
        && pieces.iter().any(|p| p.starts_with("shared"))
}

/// The registers (`%name`) an operand names: a register, a `{..}` vector of them, an
/// address `reg+offset`.
fn registers_in(operand: &str) -> Vec<&str> {
    operand
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '_' | '$')))
        .filter(|w| w.starts_with('%'))
        .collect()
}

/// PTX setting `%__bta6` to the generic address of `[address]`, an address in state
/// space `space` (`global`, `shared`, `shared::cluster`), or a generic one for `None`.
fn address_code(
    address: &str,
    space: Option<&str>,
    regs: &Registers,
    out: &mut String,
) -> Result<(), String> {
    let (base, offset) = match address.split_once('+') {
        Some((b, o)) => (b.trim(), Some(o.trim())),
        None => (address.trim(), None),
    };
    // A global address in a register or a number is generic already (what cudaMalloc
    // returned); a shared one is an offset in the CTA's window, as a variable's is.
    let window = space.filter(|s| s.starts_with("shared"));
    if base.starts_with('%') {
        match regs.bits(base) {
            Some(64) => out.push_str(&format!("mov.b64 %__bta6, {base};\n")),
            Some(32) => out.push_str(&format!("cvt.u64.u32 %__bta6, {base};\n")),
            _ => return Err(format!("address register {base} of unknown width")),
        }
    } else if base.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        let n = parse_int(base).ok_or_else(|| format!("address `{base}`"))?;
        out.push_str(&format!("mov.u64 %__bta6, {};\n", n as u64));
    } else if let Some(space) = space {
        out.push_str(&format!("mov.u64 %__bta6, {base};\n"));
        if window.is_none() {
            out.push_str(&format!("cvta.{space}.u64 %__bta6, %__bta6;\n"));
        }
    } else {
        return Err(format!(
            "a generic access through variable `{base}`, whose state space is not checked"
        ));
    }
    if let Some(window) = window {
        out.push_str(&format!("cvta.{window}.u64 %__bta6, %__bta6;\n"));
    }
    if let Some(offset) = offset {
        let n = parse_int(offset).ok_or_else(|| format!("address offset `{offset}`"))?;
        if n != 0 {
            out.push_str(&format!("add.s64 %__bta6, %__bta6, {n};\n"));
        }
    }
    Ok(())
}

/// A PTX integer literal: decimal, `0x` hex, octal `0..` or binary `0b`, signed.
fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches('U');
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(h, 16).ok()?
    } else if let Some(b) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        u64::from_str_radix(b, 2).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse::<u64>().ok()?
    };
    Some(if neg {
        (v as i64).wrapping_neg()
    } else {
        v as i64
    })
}

/// PTX putting the value `operand` (a register, an immediate or a `{..}` vector of
/// `bits`-wide lanes) into `%__bta7` (bytes 0..8) and `%__bta8` (8..16), zero-extended.
/// What cannot be read (a sink, a lane wider than its register) stays 0.
fn value_code(operand: &str, bits: u32, regs: &Registers, out: &mut String) {
    let lanes: Vec<&str> = match operand.strip_prefix('{').and_then(|o| o.strip_suffix('}')) {
        Some(inner) => inner.split(',').map(str::trim).collect(),
        None => vec![operand.trim()],
    };
    let mask = |v: &str| -> String {
        if bits >= 64 {
            String::new()
        } else {
            format!("and.b64 {v}, {v}, {};\n", (1u64 << bits) - 1)
        }
    };
    for (i, lane) in lanes.iter().enumerate() {
        let at = i as u32 * bits;
        if at >= 128 {
            break;
        }
        let target = if at < 64 { "%__bta7" } else { "%__bta8" };
        let mut code = String::new();
        if lane.starts_with('%') {
            match regs.bits(lane) {
                Some(64) => code.push_str(&format!("mov.b64 %__btv, {lane};\n")),
                Some(32) => code.push_str(&format!(
                    "mov.b32 %__bth, {lane};\ncvt.u64.u32 %__btv, %__bth;\n"
                )),
                Some(16) => code.push_str(&format!(
                    "mov.b16 %__bts, {lane};\ncvt.u64.u16 %__btv, %__bts;\n"
                )),
                _ => continue,
            }
            code.push_str(&mask("%__btv"));
        } else {
            let v = if let Some(h) = lane.strip_prefix("0f").or_else(|| lane.strip_prefix("0F")) {
                u32::from_str_radix(h, 16).ok().map(u64::from)
            } else if let Some(h) = lane.strip_prefix("0d").or_else(|| lane.strip_prefix("0D")) {
                u64::from_str_radix(h, 16).ok()
            } else {
                parse_int(lane).map(|v| v as u64)
            };
            let Some(v) = v else { continue };
            let v = if bits >= 64 {
                v
            } else {
                v & ((1u64 << bits) - 1)
            };
            code.push_str(&format!("mov.u64 %__btv, {v};\n"));
        }
        if !at.is_multiple_of(64) {
            code.push_str(&format!("shl.b64 %__btv, %__btv, {};\n", at % 64));
        }
        code.push_str(&format!("or.b64 {target}, {target}, %__btv;\n"));
        out.push_str(&code);
    }
}

fn parse_param(text: &str, decl: &[(Tok, usize, usize)]) -> Result<Param, String> {
    let words: Vec<&str> = decl
        .iter()
        .filter(|t| t.0 == Tok::Word)
        .map(|t| &text[t.1..t.2])
        .collect();
    if words.first() != Some(&".param") {
        return Err(format!("`{}` is not a `.param`", words.join(" ")));
    }
    let is_array = decl.iter().any(|t| t.0 == Tok::Punct(b'['));
    let name_index = words
        .iter()
        .rposition(|w| !w.starts_with('.') && !w.chars().all(|c| c.is_ascii_digit()))
        .ok_or("a parameter without a name")?;
    let name = words[name_index].to_string();
    let types: Vec<&str> = words[1..name_index].to_vec();
    let scalar = types.iter().rev().find_map(|t| {
        let t = t.strip_prefix('.')?;
        let class = t.chars().next()?;
        let bits: u32 = t[1..].parse().ok()?;
        matches!(class, 'u' | 's' | 'b' | 'f').then_some((class, bits))
    });
    let (class, bits) = scalar.ok_or_else(|| format!("`{name}` has no scalar type"))?;
    if is_array {
        let align = types
            .iter()
            .position(|t| *t == ".align")
            .and_then(|p| words.get(p + 2))
            .and_then(|a| a.parse().ok())
            .unwrap_or(bits / 8);
        let count: u32 = words
            .get(name_index + 1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("`{name}` is an array without a length"))?;
        return Ok(Param {
            name,
            ty: ParamType::Bytes {
                align,
                len: count * (bits / 8).max(1),
            },
        });
    }
    Ok(Param {
        name,
        ty: ParamType::Scalar { class, bits },
    })
}

/// The probe function's ABI that spliced calls use: the kernel's first six parameters,
/// widened, as `.param .b64` arguments; the probe builds its `pt_regs`-shaped context from
/// them (`bpftime_jit_ptx::ProbeAbi::Arguments` with [`CTX_SIZE`] and [`ARG_OFFSETS`]).
pub const PROBE_ARGS: usize = 6;

/// Where probe bodies are inlined ([`InlineBody`], by symbol), and a count of the
/// instances made so far, which names each one.
struct Inlining<'a> {
    bodies: &'a HashMap<&'a str, InlineBody>,
    sites: &'a mut usize,
    /// Statements still allowed ([`crate::inline::MODULE_INLINE_BUDGET`]).
    budget: &'a mut usize,
    /// Whether an instance in this kernel reads the SM's id
    /// ([`crate::inline::SM_REGISTER`]).
    reads_sm: bool,
}

fn kernel_edits(
    kernel: &Kernel,
    calls: &[ProbeCall],
    bodies: &HashMap<&str, InlineBody>,
    sites: &mut usize,
    budget: &mut usize,
) -> Vec<(usize, usize, String)> {
    let first_site = *sites;
    let mut inlining = Inlining {
        bodies,
        sites,
        budget,
        reads_sm: false,
    };
    let of = |point| -> Vec<&str> {
        calls
            .iter()
            .filter(|c| c.point == point)
            .map(|c| c.symbol.as_str())
            .collect()
    };
    let (entry, exit) = (of(ProbePoint::Entry), of(ProbePoint::Exit));
    let accesses = [ProbePoint::Access, ProbePoint::SharedAccess].map(|p| (p, of(p)));
    let mut edits = Vec::new();
    if !entry.is_empty() {
        edits.push((
            kernel.body_open + 1,
            0,
            format!(
                "\n{}",
                probe_calls(&kernel.params, &entry, None, None, &mut inlining)
            ),
        ));
    }
    if !exit.is_empty() {
        for site in &kernel.exits {
            let mut code = String::from("\n");
            code.push_str(&probe_calls(
                &kernel.params,
                &exit,
                site.guard.as_deref(),
                None,
                &mut inlining,
            ));
            let original = match &site.guard {
                Some(g) => format!("{g} {};", site.opcode),
                None => format!("{};", site.opcode),
            };
            code.push_str(&original);
            edits.push((site.start, site.end - site.start, code));
        }
    }
    let id = kernel_id(&kernel.name);
    // Calls after their accesses, by where they go: several accesses' calls may go at
    // one place (see `defer_calls`), where they run in their accesses' order.
    let mut after_calls: std::collections::BTreeMap<usize, String> = Default::default();
    for (point, symbols) in accesses.iter().filter(|a| !a.1.is_empty()) {
        // Each kind of probe numbers the sites it sees.
        let sites = kernel.accesses.iter().filter(|a| point.sees(a.space));
        for (index, site) in sites.enumerate() {
            let word = |space: AccessSpace| {
                u64::from(site.size) | (site.kind as u64) << 32 | (space as u64) << 48
            };
            if let Some(tensor) = &site.tensor {
                let calls = tensor_calls(
                    &kernel.params,
                    tensor,
                    site.guard.as_deref(),
                    &format!("$__bt_tensor_{}_{index}", *point as u8),
                    [
                        word(AccessSpace::Global),
                        u64::from(id) | (index as u64) << 32,
                        u64::from(NO_BASE_ARG),
                    ],
                    symbols,
                    &mut inlining,
                );
                after_calls
                    .entry(site.call_at)
                    .or_default()
                    .push_str(&format!("\n{calls}"));
                continue;
            }
            let mut prepare = site.prepare.clone();
            let guard = match site.space {
                SiteSpace::Global => {
                    prepare.push_str(&format!(
                        "mov.u64 %__bta9, {};\n",
                        word(AccessSpace::Global)
                    ));
                    site.guard.as_deref()
                }
                SiteSpace::Shared => {
                    prepare.push_str(&format!(
                        "mov.u64 %__bta9, {};\n",
                        word(AccessSpace::Shared)
                    ));
                    site.guard.as_deref()
                }
                SiteSpace::Generic => {
                    // The calls run where the address is in a space probed, and say which.
                    prepare.push_str("isspacep.global %__btp, %__bta6;\n");
                    if *point == ProbePoint::SharedAccess {
                        prepare.push_str(&format!(
                            "isspacep.shared %__btr, %__bta6;\nor.pred %__btp, %__btp, %__btr;\n\
                             selp.b64 %__bta9, {}, {}, %__btr;\n",
                            word(AccessSpace::Shared),
                            word(AccessSpace::Global)
                        ));
                    } else {
                        prepare.push_str(&format!(
                            "mov.u64 %__bta9, {};\n",
                            word(AccessSpace::Global)
                        ));
                    }
                    guarded("%__btp", site.guard.as_deref(), "%__btq", &mut prepare);
                    Some("@%__btp")
                }
            };
            if let Some(reg) = &site.size_reg {
                prepare.push_str(&format!(
                    "cvt.u64.u32 %__btv, {reg};\nor.b64 %__bta9, %__bta9, %__btv;\n"
                ));
            }
            // A matrix row's probe runs in the lanes that name a row; a probe of an access
            // whose size is in a register, in one lane at a time (the loop below).
            let guard = match (site.lanes, &site.size_reg) {
                (None, None) => guard,
                (Some(n), _) => {
                    prepare.push_str(&format!(
                        "mov.u32 %__btl, %laneid;\nsetp.lt.u32 %__btq, %__btl, {n};\n"
                    ));
                    guarded("%__btq", guard, "%__btr", &mut prepare);
                    Some("@%__btp")
                }
                (None, Some(_)) => {
                    prepare.push_str(
                        "mov.u32 %__btl, %laneid;\nsetp.eq.u32 %__btq, %__btl, %__btk;\n",
                    );
                    guarded("%__btq", guard, "%__btr", &mut prepare);
                    Some("@%__btp")
                }
            };
            prepare.push_str(&format!(
                "mov.u64 %__bta10, {};\nmov.u64 %__bta11, {};\n",
                u64::from(id) | (index as u64) << 32,
                site.base_arg.map_or(NO_BASE_ARG, |i| i as u32)
            ));
            let mut calls = probe_calls(
                &kernel.params,
                symbols,
                guard,
                Some(&prepare),
                &mut inlining,
            );
            if site.size_reg.is_some() {
                let label = format!("$__bt_lane_{}_{index}", *point as u8);
                calls = format!(
                    "{{\n.reg .b32 %__btk;\n.reg .pred %__btz;\nmov.u32 %__btk, 0;\n{label}:\n\
                     {calls}\nadd.u32 %__btk, %__btk, 1;\nsetp.lt.u32 %__btz, %__btk, 32;\n\
                     @%__btz bra {label};\n}}"
                );
            }
            match site.after {
                true => after_calls
                    .entry(site.call_at)
                    .or_default()
                    .push_str(&format!("\n{calls}")),
                false => edits.push((site.start, 0, format!("{calls}\n"))),
            }
        }
    }
    edits.extend(after_calls.into_iter().map(|(at, calls)| (at, 0, calls)));
    // Pushed last, so that it lands first at the body's opening (edits at one offset are
    // applied back to front): the register is declared before any probe reads it.
    if *inlining.sites > first_site && inlining.reads_sm {
        edits.push((
            kernel.body_open + 1,
            0,
            format!(
                "\n.reg .b32 {sm};\nmov.u32 {sm}, %smid;",
                sm = crate::inline::SM_REGISTER
            ),
        ));
    }
    edits
}

/// The calls of `symbols` at tensor copy `tensor` (under the statement's `guard`): for
/// each lane in turn that issues it, its map looked up in the table the host keeps
/// ([`TENSOR_MAPS_GLOBAL`]) and a call per row of the box that lies in the tensor, with
/// the row's global address and bytes (the first dimension clipped to the tensor, as
/// the copy clips it). A map not in the table (encoded where the host did not see it,
/// or changed on the device) gets no calls. `args` are the calls' `%__bta9` (the
/// access's word, size 0), `%__bta10` and `%__bta11`; `label` names this site's labels.
fn tensor_calls(
    params: &[Param],
    tensor: &TensorBox,
    guard: Option<&str>,
    label: &str,
    args: [u64; 3],
    symbols: &[&str],
    inlining: &mut Inlining<'_>,
) -> String {
    let rank = tensor.coords.len();
    let mut p = String::from("mov.u32 %__btl, %laneid;\nsetp.eq.u32 %__btq, %__btl, %__btk;\n");
    guarded("%__btq", guard, "%__btr", &mut p);
    // The map's entry, found at the box's first row and kept for the others.
    p.push_str(&format!(
        "setp.eq.u32 %__btr, %__btj, 0;\n@!%__btr bra {label}_box;\n\
         mov.u32 %__btn, 0;\nmov.u64 %__btm, 0;\n@!%__btp bra {label}_box;\n"
    ));
    p.push_str(&format!("mov.b64 %__btt0, {};\n", tensor.map));
    p.push_str(&format!(
        "ld.global.u64 %__btt1, [{TENSOR_MAPS_GLOBAL}];\nsetp.eq.u64 %__btr, %__btt1, 0;\n\
         @%__btr bra {label}_box;\nld.u32 %__btu0, [%__btt1];\n\
         add.u64 %__btt1, %__btt1, {TENSOR_MAPS_HEAD};\n{label}_entry:\n\
         setp.eq.u32 %__btr, %__btu0, 0;\n@%__btr bra {label}_box;\n"
    ));
    for w in 0..16 {
        p.push_str(&format!(
            "ld.u64 %__btt2, [%__btt0+{o}];\nld.u64 %__btt3, [%__btt1+{o}];\n\
             setp.ne.u64 %__btr, %__btt2, %__btt3;\n@%__btr bra {label}_next;\n",
            o = w * 8
        ));
    }
    // Found: the box has the product of its other dimensions' sizes as rows.
    p.push_str("mov.u64 %__btm, %__btt1;\nmov.u32 %__btn, 1;\n");
    for d in 1..rank {
        p.push_str(&format!(
            "ld.u32 %__btu1, [%__btm+{}];\nmul.lo.u32 %__btn, %__btn, %__btu1;\n",
            224 + 4 * d
        ));
    }
    p.push_str(&format!(
        "bra {label}_box;\n{label}_next:\nadd.u64 %__btt1, %__btt1, {TENSOR_MAP_ENTRY};\n\
         sub.u32 %__btu0, %__btu0, 1;\nbra {label}_entry;\n{label}_box:\n\
         setp.ne.u64 %__btr, %__btm, 0;\nand.pred %__btp, %__btp, %__btr;\n\
         @!%__btp bra {label}_row_done;\n"
    ));
    // Row %__btj: its coordinates in the other dimensions, each inside the tensor.
    p.push_str("ld.u64 %__bta6, [%__btm+128];\nmov.u32 %__btu0, %__btj;\n");
    for (d, coord) in tensor.coords.iter().enumerate().skip(1) {
        p.push_str(&format!(
            "ld.u32 %__btu1, [%__btm+{box_at}];\nrem.u32 %__btu2, %__btu0, %__btu1;\n\
             div.u32 %__btu0, %__btu0, %__btu1;\nadd.s32 %__btu2, %__btu2, {coord};\n\
             cvt.s64.s32 %__btt2, %__btu2;\nld.u64 %__btt3, [%__btm+{dim_at}];\n\
             setp.lt.u64 %__btr, %__btt2, %__btt3;\nand.pred %__btp, %__btp, %__btr;\n\
             ld.u64 %__btt3, [%__btm+{stride_at}];\nmad.lo.s64 %__bta6, %__btt2, %__btt3, %__bta6;\n",
            box_at = 224 + 4 * d,
            dim_at = 144 + 8 * d,
            stride_at = 184 + 8 * d,
        ));
    }
    // The first dimension, clipped: elements max(c0, 0) to min(c0 + box0, dim0).
    let first = &tensor.coords[0];
    p.push_str(&format!(
        "mov.b32 %__btu2, {first};\ncvt.s64.s32 %__btt2, %__btu2;\nld.u32 %__btu1, [%__btm+224];\n\
         cvt.u64.u32 %__btt3, %__btu1;\nadd.s64 %__btt3, %__btt3, %__btt2;\n\
         ld.u64 %__btt1, [%__btm+144];\nmin.s64 %__btt3, %__btt3, %__btt1;\n\
         max.s64 %__btt2, %__btt2, 0;\nsetp.lt.s64 %__btr, %__btt2, %__btt3;\n\
         and.pred %__btp, %__btp, %__btr;\nsub.s64 %__btt3, %__btt3, %__btt2;\n\
         ld.u32 %__btu1, [%__btm+140];\ncvt.u64.u32 %__btt1, %__btu1;\n\
         mad.lo.s64 %__bta6, %__btt2, %__btt1, %__bta6;\nmul.lo.s64 %__btt3, %__btt3, %__btt1;\n\
         {label}_row_done:\n"
    ));
    let [word, site, base] = args;
    p.push_str(&format!(
        "mov.u64 %__bta7, 0;\nmov.u64 %__bta8, 0;\nor.b64 %__bta9, %__btt3, {word};\n\
         mov.u64 %__bta10, {site};\nmov.u64 %__bta11, {base};\n"
    ));
    let calls = probe_calls(params, symbols, Some("@%__btp"), Some(&p), inlining);
    format!(
        "{{\n.reg .b32 %__btk, %__btj, %__btn, %__btu<3>;\n.reg .b64 %__btm, %__btt<4>;\n\
         .reg .pred %__btz;\nmov.u32 %__btk, 0;\n{label}_lane:\nmov.u32 %__btj, 0;\n\
         {label}_row:\n{calls}\nadd.u32 %__btj, %__btj, 1;\nsetp.lt.u32 %__btz, %__btj, %__btn;\n\
         @%__btz bra {label}_row;\nadd.u32 %__btk, %__btk, 1;\nsetp.lt.u32 %__btz, %__btk, 32;\n\
         @%__btz bra {label}_lane;\n}}"
    )
}

/// PTX setting `%__btp` to predicate `pred` and, where there is one, `guard` (`@%p` or
/// `@!%p`, a statement's own), negated into `scratch`: the probe calls then run under
/// `@%__btp`.
fn guarded(pred: &str, guard: Option<&str>, scratch: &str, out: &mut String) {
    match guard.map(|g| g.trim_start_matches('@')) {
        None if pred == "%__btp" => {}
        None => out.push_str(&format!("mov.pred %__btp, {pred};\n")),
        Some(g) => match g.strip_prefix('!') {
            Some(reg) => out.push_str(&format!(
                "not.pred {scratch}, {reg};\nand.pred %__btp, {pred}, {scratch};\n"
            )),
            None => out.push_str(&format!("and.pred %__btp, {pred}, {g};\n")),
        },
    }
}

/// A block that loads the kernel's first six parameters, widened to 64 bits (0 for the
/// ones it lacks), and calls each of `symbols` with them, under `guard` if any. With
/// `access` (PTX setting `%__bta6`..`%__bta11`, see [`AccessSite`]), the calls pass
/// those six too.
fn probe_calls(
    params: &[Param],
    symbols: &[&str],
    guard: Option<&str>,
    access: Option<&str>,
    inlining: &mut Inlining<'_>,
) -> String {
    let count = PROBE_ARGS + if access.is_some() { ACCESS_ARGS } else { 0 };
    let mut s = format!("{{\n.reg .b64 %__bta<{count}>;\n.reg .b32 %__bth;\n.reg .b16 %__bts;\n");
    if access.is_some() {
        s.push_str(".reg .b64 %__btv;\n.reg .pred %__btp, %__btq, %__btr;\n.reg .b32 %__btl;\n");
    }
    for i in 0..PROBE_ARGS {
        let to = format!("%__bta{i}");
        let Some(p) = params.get(i) else {
            s.push_str(&format!("mov.u64 {to}, 0;\n"));
            continue;
        };
        let name = &p.name;
        match p.ty {
            ParamType::Scalar { bits: 64, .. } => {
                s.push_str(&format!("ld.param.b64 {to}, [{name}];\n"));
            }
            ParamType::Scalar { class, bits: 32 } => {
                let cvt = if class == 's' {
                    "cvt.s64.s32"
                } else {
                    "cvt.u64.u32"
                };
                s.push_str(&format!(
                    "ld.param.b32 %__bth, [{name}];\n{cvt} {to}, %__bth;\n"
                ));
            }
            ParamType::Scalar { class, bits } if bits == 16 || bits == 8 => {
                // Sub-word loads need a 16-bit or wider destination, which the load
                // extends; the conversion widens those 16 bits.
                let (load, cvt) = if class == 's' {
                    (format!("ld.param.s{bits}"), "cvt.s64.s16")
                } else {
                    (format!("ld.param.u{bits}"), "cvt.u64.u16")
                };
                s.push_str(&format!("{load} %__bts, [{name}];\n{cvt} {to}, %__bts;\n"));
            }
            ParamType::Scalar { .. } | ParamType::Bytes { .. } => {
                s.push_str(&format!(
                    "mov.u64 {to}, {name};\ncvta.param.u64 {to}, {to};\n"
                ));
            }
        }
    }
    if let Some(access) = access {
        s.push_str(access);
    }
    let args: Vec<String> = (0..count).map(|i| format!("__bt_a{i}")).collect();
    let predicate = guard;
    let guard = guard.map(|g| format!("{g} ")).unwrap_or_default();
    // Each call gets argument storage of its own: a callee may use the space of the
    // arguments it was passed, so a second call cannot count on finding them there
    // (seen on an H100: the second of two probes read a constant instead of `n`).
    for symbol in symbols {
        if let Some(body) = inlining
            .bodies
            .get(symbol)
            .filter(|b| b.statements() <= *inlining.budget)
        {
            s.push_str(&body.instantiate(*inlining.sites, predicate));
            inlining.reads_sm |= body.reads_sm();
            *inlining.sites += 1;
            *inlining.budget -= body.statements();
            continue;
        }
        s.push_str("{\n");
        for (i, a) in args.iter().enumerate() {
            s.push_str(&format!(
                ".param .b64 {a};\nst.param.b64 [{a}], %__bta{i};\n"
            ));
        }
        s.push_str(".param .b64 __bt_ret;\n");
        s.push_str(&format!(
            "{guard}call (__bt_ret), {symbol}, ({});\n}}\n",
            args.join(", ")
        ));
    }
    s.push_str("}\n");
    s
}

/// Drops the header directives (`.version`, `.target`, `.address_size`) of a module
/// written by `bpftime-jit-ptx`, leaving its definitions for a [`Splice`].
pub fn strip_header(ptx: &str) -> String {
    ptx.lines()
        .filter(|l| {
            let t = l.trim_start();
            !(t.starts_with(".version")
                || t.starts_with(".target")
                || t.starts_with(".address_size"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
