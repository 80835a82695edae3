//! One program's preparation, the same in every process that handles it.
//!
//! - At load (`BPF_PROG_LOAD`, in the tool's process): map references become store ids
//!   ([`resolve_maps`]) and the program is checked ([`check_program`]): its structure,
//!   then the verifier, with the maps as the store has them ([`desc_of`]).
//! - Where it runs (the agent in a target, the shim's test run, GPU attach): map
//!   references become addresses of that process's or device's maps ([`relocate`]).

use bpftime_isa::helpers::{self, Engine};
use bpftime_isa::{opcode as op, Insn};
use bpftime_runtime::Map;
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, SourceLine};

/// A store map as the verifier sees it.
pub fn desc(m: &Map) -> MapDesc {
    MapDesc {
        map_type: m.map_type(),
        key_size: m.key_size(),
        value_size: m.value_size(),
        max_entries: m.max_entries(),
        flags: m.map_flags(),
        frozen: m.is_frozen(),
        frozen_value: m.frozen_value().map(Into::into),
    }
}

/// The template of a map of maps' inner maps, as the verifier sees it.
fn inner_desc(m: &Map) -> Option<MapDesc> {
    m.inner_template().map(|t| MapDesc {
        map_type: t.map_type,
        key_size: t.key_size,
        value_size: t.value_size,
        max_entries: t.max_entries,
        flags: t.map_flags,
        // Inner maps are found at run time: none is known to be frozen.
        ..MapDesc::default()
    })
}

/// What the verifier asks about the map with store id `key`, or, for the
/// [`inner_map_key`](bpftime_verifier::inner_map_key) of one, about its inner maps.
pub fn desc_of<M: AsRef<Map>>(
    maps: &std::collections::HashMap<u32, M>,
    key: u32,
) -> Option<MapDesc> {
    match bpftime_verifier::inner_map_owner(key as i32) {
        Some(outer) => inner_desc(maps.get(&(outer as u32))?.as_ref()),
        None => maps.get(&key).map(|m| desc(m.as_ref())),
    }
}

/// Rewrites every map reference (`lddw` with a map fd or a map index into
/// `fd_array`) to carry the map's store id. `resolve(fd_or_index, by_index)`
/// returns that id. Returns the rewritten program and the ids it uses.
pub fn resolve_maps(
    insns: &[Insn],
    mut resolve: impl FnMut(i32, bool) -> Result<u32, i32>,
) -> Result<(Vec<Insn>, Vec<u32>), (i32, String)> {
    let mut out = insns.to_vec();
    let mut ids = Vec::new();
    let mut pc = 0;
    while pc < out.len() {
        let i = out[pc];
        if !i.is_lddw() {
            pc += 1;
            continue;
        }
        if pc + 1 >= out.len() {
            return Err((
                libc::EINVAL,
                format!("{pc}: invalid lddw: the second half is missing\n"),
            ));
        }
        match i.src {
            0 | op::PSEUDO_FUNC => {}
            op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE | op::PSEUDO_MAP_IDX | op::PSEUDO_MAP_IDX_VALUE => {
                let by_index = matches!(i.src, op::PSEUDO_MAP_IDX | op::PSEUDO_MAP_IDX_VALUE);
                let id = resolve(i.imm, by_index).map_err(|e| {
                    (e, format!("{pc}: (18) r{} = map {}: fd {} does not refer to a map\n", i.dst, if by_index { "index" } else { "fd" }, i.imm))
                })?;
                out[pc].imm = id as i32;
                // Keep the kind (a map, or a map value); the index forms become fd forms.
                out[pc].src = match i.src {
                    op::PSEUDO_MAP_IDX => op::PSEUDO_MAP_FD,
                    op::PSEUDO_MAP_IDX_VALUE => op::PSEUDO_MAP_VALUE,
                    s => s,
                };
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            op::PSEUDO_BTF_ID => {
                return Err((
                    libc::EINVAL,
                    format!("{pc}: (18) r{} = kernel variable: kernel symbols (ksyms) do not exist in userspace; bpftime cannot load this program\n", i.dst),
                ))
            }
            s => return Err((libc::EINVAL, format!("{pc}: invalid lddw source {s}\n"))),
        }
        pc += 2;
    }
    Ok((out, ids))
}

/// A map reference in a stored program, as [`relocate`] hands it to its resolver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapRef {
    /// The map itself (`lddw` with `BPF_PSEUDO_MAP_FD`), by store id.
    Map(u32),
    /// An address `offset` bytes into the map's first value (`BPF_PSEUDO_MAP_VALUE`:
    /// global data), by store id.
    Value { map: u32, offset: u32 },
}

impl MapRef {
    /// The store id of the map referred to.
    pub fn map(self) -> u32 {
        match self {
            MapRef::Map(id) | MapRef::Value { map: id, .. } => id,
        }
    }
}

/// Rewrites every map reference of a stored program (an `lddw` that [`resolve_maps`]
/// left carrying a store id) into a plain 64-bit constant: the address `resolve` gives
/// for it, in the process or on the device where the program runs. Other instructions
/// are kept as they are; the first error of `resolve` is returned.
pub fn relocate<E>(
    insns: &[Insn],
    mut resolve: impl FnMut(MapRef) -> Result<u64, E>,
) -> Result<Vec<Insn>, E> {
    let mut out = insns.to_vec();
    let mut pc = 0;
    while pc + 1 < out.len() {
        let i = out[pc];
        if !i.is_lddw() {
            pc += 1;
            continue;
        }
        let reference = match i.src {
            op::PSEUDO_MAP_FD => Some(MapRef::Map(i.imm as u32)),
            op::PSEUDO_MAP_VALUE => Some(MapRef::Value {
                map: i.imm as u32,
                offset: out[pc + 1].imm as u32,
            }),
            _ => None,
        };
        if let Some(reference) = reference {
            let addr = resolve(reference)?;
            out[pc].src = 0;
            out[pc].imm = addr as u32 as i32;
            out[pc + 1].imm = (addr >> 32) as u32 as i32;
        }
        pc += 2;
    }
    Ok(out)
}

/// A rejection: the errno the kernel gives for the same fault, and the log.
pub type Rejection = (i32, String);

/// Checks a program before it is stored, returning the log on success or the
/// rejection. Structure first (registers, jump targets, complete `lddw`s, known
/// helpers, an exit at the end: EINVAL as in the kernel), then, for the program
/// types bpftime runs, the verifier (the errno the kernel gives for that refusal, EACCES for an unsafe program, with its log).
pub fn check_program(
    insns: &[Insn],
    prog_type: u32,
    maps: &dyn Fn(u32) -> Option<MapDesc>,
    log_level: u32,
) -> Result<String, Rejection> {
    check_program_with_lines(insns, prog_type, maps, log_level, Vec::new(), false)
}

/// [`check_program`] with the loader's source lines (see [`source_lines`]), which a
/// rejection log names as the kernel's does, and whether the program runs on a GPU
/// (it is then checked against the GPU's helpers and rules).
pub fn check_program_with_lines(
    insns: &[Insn],
    prog_type: u32,
    maps: &dyn Fn(u32) -> Option<MapDesc>,
    log_level: u32,
    source_lines: Vec<SourceLine>,
    gpu: bool,
) -> Result<String, Rejection> {
    check_program_full(insns, prog_type, maps, log_level, source_lines, gpu).map(|(log, _)| log)
}

/// [`check_program_with_lines`], with how far into its context the program loads
/// (the verifier's `ctx_read_end`; 0 for a program type that is not verified).
pub fn check_program_full(
    insns: &[Insn],
    prog_type: u32,
    maps: &dyn Fn(u32) -> Option<MapDesc>,
    log_level: u32,
    source_lines: Vec<SourceLine>,
    gpu: bool,
) -> Result<(String, u32), Rejection> {
    use bpftime_isa::uapi::prog_type as pt;
    let structural = check_structure(insns, gpu)?;
    if !matches!(prog_type, pt::KPROBE | pt::TRACEPOINT | pt::RAW_TRACEPOINT) {
        // Other types (libbpf's feature probes load a few) are stored but never run.
        return Ok((structural, 0));
    }
    let info = ProgramInfo {
        insns,
        prog_type,
        gpu,
        maps: &|imm: i32| maps(imm as u32),
        mem_len: 0,
    };
    let opts = Options {
        log_level,
        source_lines,
        ..Options::default()
    };
    match verify(&info, &opts) {
        Ok(v) => Ok((
            format!(
                "{}processed {} insns, {} states, {} pruned; stack depth {}\n",
                v.log, v.insns_processed, v.states, v.pruned, v.stack_depth
            ),
            v.ctx_read_end,
        )),
        Err(r) => Err((r.kind.errno(), r.log())),
    }
}

/// Resolves `BPF_PROG_LOAD`'s line info: `records` holds `struct bpf_line_info`
/// entries (`rec_size` bytes apart, the first 16 bytes of each: insn_off,
/// file_name_off, line_off, line_col) whose names are offsets into the string
/// section of `btf`. Line info is a diagnostic aid, so anything malformed drops
/// the record (or all of them) instead of failing the load.
pub fn source_lines(btf: &[u8], records: &[u8], rec_size: usize) -> Vec<SourceLine> {
    let u32_at = |b: &[u8], off: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
    };
    let strings = (|| {
        if u16::from_ne_bytes(btf.get(0..2)?.try_into().ok()?) != 0xeb9f {
            return None;
        }
        let hdr_len = u32_at(btf, 4)? as usize;
        let str_off = u32_at(btf, 16)? as usize;
        let str_len = u32_at(btf, 20)? as usize;
        let start = hdr_len.checked_add(str_off)?;
        btf.get(start..start.checked_add(str_len)?)
    })();
    let Some(strings) = strings else {
        return Vec::new();
    };
    let string = |off: u32| -> Option<String> {
        let tail = strings.get(off as usize..)?;
        let end = tail.iter().position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    if rec_size < 16 {
        return Vec::new();
    }
    let mut lines: Vec<SourceLine> = records
        .chunks_exact(rec_size)
        .filter_map(|r| {
            Some(SourceLine {
                insn: u32_at(r, 0)? as usize,
                file: string(u32_at(r, 4)?)?,
                text: string(u32_at(r, 8)?)?,
                line: u32_at(r, 12)? >> 10,
            })
        })
        .collect();
    lines.sort_by_key(|l| l.insn);
    lines
}

fn check_structure(insns: &[Insn], gpu: bool) -> Result<String, Rejection> {
    let n = insns.len();
    // Malformed programs are EINVAL in the kernel; unsafe ones are EACCES.
    let reject = |pc: usize, why: String| {
        Err((
            libc::EINVAL,
            format!("{pc}: (0x{:02x}) {why}\n", insns[pc].code),
        ))
    };
    let mut pc = 0;
    while pc < n {
        let i = insns[pc];
        if i.dst > 10 || i.src > 10 && !matches!(i.class(), op::LD) && i.code != op::CALL_INSN {
            return reject(pc, "invalid register".into());
        }
        let class = i.class();
        if i.dst == 10 && matches!(class, op::ALU | op::ALU64 | op::LDX) {
            return Err((
                libc::EACCES,
                format!("{pc}: (0x{:02x}) frame pointer is read only\n", i.code),
            ));
        }
        if class == op::JMP || class == op::JMP32 {
            let code = i.code & op::OP_MASK;
            if i.code == op::CALL_INSN {
                match i.src {
                    op::CALL_HELPER => {
                        let engine = if gpu {
                            Engine::Gpu
                        } else {
                            Engine::Interpreter
                        };
                        match helpers::require(i.imm as u32, engine) {
                            Ok(_) => {}
                            Err(why @ helpers::Unavailable::Unknown { .. }) => {
                                return reject(pc, why.to_string())
                            }
                            // Known but not on this engine: EACCES, as the verifier
                            // refuses it (which only checks the program types it runs).
                            Err(why) => {
                                return Err((
                                    libc::EACCES,
                                    format!("{pc}: (0x{:02x}) {why}\n", i.code),
                                ))
                            }
                        }
                    }
                    op::CALL_PSEUDO => {
                        let t = pc as i64 + 1 + i.imm as i64;
                        if t < 0 || t >= n as i64 {
                            return reject(pc, format!("call to pc {t} is out of range"));
                        }
                    }
                    _ => {
                        return reject(
                            pc,
                            "calls to kernel functions (kfuncs) do not exist in userspace".into(),
                        )
                    }
                }
            } else if code != op::EXIT {
                let off = if class == op::JMP32 && code == op::JA {
                    i.imm as i64
                } else {
                    i.off as i64
                };
                let t = pc as i64 + 1 + off;
                if t < 0 || t >= n as i64 {
                    return reject(pc, format!("jump out of range from insn {pc} to {t}"));
                }
            }
        }
        pc += if i.is_lddw() { 2 } else { 1 };
    }
    let last = insns[n - 1];
    let ends = last.code == op::EXIT_INSN
        || (last.class() == op::JMP && last.code & op::OP_MASK == op::JA);
    if !ends {
        return Err((
            libc::EINVAL,
            format!("{}: last insn is not an exit or jmp\n", n - 1),
        ));
    }
    Ok(format!(
        "processed {n} insns (structural checks; the full verifier is not wired in yet)\n"
    ))
}
