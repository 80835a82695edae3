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

mod edits;
mod parse;
mod sites;

use edits::kernel_edits;
pub use parse::entry_names;
use parse::{
    first_definition, line_end, module_variables, parse_kernel, parse_version, tokens, Tok,
};

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
    crate::fnv1a(mangled.as_bytes())
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

/// The probe function's ABI that spliced calls use: the kernel's first six parameters,
/// widened, as `.param .b64` arguments; the probe builds its `pt_regs`-shaped context from
/// them (`bpftime_jit_ptx::ProbeAbi::Arguments` with [`CTX_SIZE`] and [`ARG_OFFSETS`]).
pub const PROBE_ARGS: usize = 6;

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
