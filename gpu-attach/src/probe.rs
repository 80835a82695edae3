//! Compiling a GPU probe: its map references made device addresses, its helpers lowered
//! for the GPU with the device runtime linked in, as a PTX function to splice.

use std::collections::HashMap;

use bpftime_isa::{opcode as op, Insn};
use bpftime_jit_ptx::{
    compile, ArrayMapLayout, GpuEnv, ProbeAbi, PtxOptions, PtxProgram, PtxVersion,
};

use crate::cuda::DevicePtr;
use crate::device_maps::{library_ir, RuntimeConfig};
use crate::ptx::{ProbePoint, ACCESS_OFFSETS, ARG_OFFSETS, CTX_SIZE};

/// Where one of a probe's maps lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMapRef {
    /// The map's descriptor (`struct gpu_map`): what `lddw map` loads.
    pub desc: DevicePtr,
    /// The first value, for maps with values in place (arrays): where `lddw map_value`
    /// (global data) points, plus its offset.
    pub values: Option<DevicePtr>,
    /// How lookups inline, for arrays.
    pub array: Option<ArrayMapLayout>,
}

/// The ABI spliced calls at `point` use (see `ptx`): the kernel's six arguments, and an
/// access probe's five more, laid out as `pt_regs`.
pub fn probe_abi(point: ProbePoint) -> ProbeAbi {
    let extra: &[usize] = match point {
        ProbePoint::Entry | ProbePoint::Exit => &[],
        ProbePoint::Access | ProbePoint::SharedAccess => &ACCESS_OFFSETS,
    };
    ProbeAbi::Arguments {
        size: CTX_SIZE as u32,
        offsets: ARG_OFFSETS.iter().chain(extra).map(|&o| o as u32).collect(),
    }
}

/// Compiles `insns` (store map ids in `lddw`s, as `maps` keys) into a PTX probe function
/// `symbol(..)` called at `point`, for `sm_XY`, with the device runtime of `config`
/// inlined. Fails, saying why, when the program needs something the GPU runtime does not
/// have.
pub fn compile_probe(
    point: ProbePoint,
    insns: &[Insn],
    maps: &HashMap<u32, DeviceMapRef>,
    config: &RuntimeConfig,
    sm: u32,
    symbol: &str,
) -> Result<PtxProgram, String> {
    let insns = relocate(insns, maps)?;
    let env = ProbeEnv {
        library: library_ir(config),
        arrays: maps
            .values()
            .filter_map(|m| Some((m.desc, m.array?)))
            .collect(),
    };
    let opts = PtxOptions {
        sm,
        ptx_version: PtxVersion::DEFAULT,
        symbol: symbol.to_string(),
        kernel: false,
        probe_abi: probe_abi(point),
        ..PtxOptions::default()
    };
    let program = compile(&insns, &env, &opts).map_err(|e| e.to_string())?;
    if !program.externs.is_empty() {
        return Err(format!(
            "it calls helpers the GPU runtime lacks: {}",
            program.externs.join(", ")
        ));
    }
    Ok(program)
}

/// Rewrites `lddw` map references (store ids) into device addresses: a map becomes its
/// replica's descriptor, a map value (global data) the replica's first value plus the
/// offset.
fn relocate(insns: &[Insn], maps: &HashMap<u32, DeviceMapRef>) -> Result<Vec<Insn>, String> {
    let mut out = insns.to_vec();
    let mut pc = 0;
    while pc < out.len() {
        let i = out[pc];
        if !(i.is_lddw() && pc + 1 < out.len()) {
            pc += 1;
            continue;
        }
        if matches!(i.src, op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE) {
            let id = i.imm as u32;
            let r = maps
                .get(&id)
                .ok_or_else(|| format!("map {id} is not among the program's maps"))?;
            let addr = if i.src == op::PSEUDO_MAP_FD {
                r.desc
            } else {
                r.values
                    .ok_or_else(|| format!("map {id} has no values to point into"))?
                    + out[pc + 1].imm as u32 as u64
            };
            out[pc].src = 0;
            out[pc].imm = addr as u32 as i32;
            out[pc + 1].imm = (addr >> 32) as u32 as i32;
        }
        pc += 2;
    }
    Ok(out)
}

/// The helpers, inlined array maps and device runtime a probe is compiled with.
struct ProbeEnv {
    library: String,
    arrays: HashMap<DevicePtr, ArrayMapLayout>,
}

impl GpuEnv for ProbeEnv {
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.arrays.get(&map).copied()
    }

    fn library(&self) -> Option<&str> {
        Some(&self.library)
    }
}
