use std::collections::HashMap;
use std::sync::Mutex;

use bpftime_isa::opcode as op;
use bpftime_isa::Insn;
use tracing::debug;

use bpftime_lifter::{ArrayMapLayout, CpuSlotTable};

use crate::{JitEnv, JitError, JitOptions, JitProgram};

/// Everything the machine code depends on: the bytecode, the address of every helper it
/// may call, and the options. Stored whole, so a hash collision cannot alias programs.
#[derive(Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    insns: Vec<Insn>,
    helpers: Vec<(u32, Option<u64>)>,
    array_maps: Vec<(u64, ArrayMapLayout)>,
    cpu_number_offset: Option<u64>,
    cpu_slots: Option<CpuSlotTable>,
    opts: JitOptions,
}

impl CacheKey {
    fn new(insns: &[Insn], env: &dyn JitEnv, opts: &JitOptions) -> Self {
        let mut ids: Vec<u32> = Vec::new();
        let mut array_maps = Vec::new();
        let mut callx = false;
        for (pc, i) in insns.iter().enumerate() {
            let prev_is_lddw = pc > 0 && insns[pc - 1].is_lddw();
            if i.code == op::CALL_INSN && i.src == op::CALL_HELPER && !prev_is_lddw {
                ids.push(i.imm as u32);
            }
            callx |= i.code == op::CALL_INSN | op::X && !prev_is_lddw;
            if i.is_lddw() && !prev_is_lddw {
                let hi = insns.get(pc + 1).map_or(0, |n| n.imm as u32);
                let v = u64::from(i.imm as u32) | u64::from(hi) << 32;
                if let Some(layout) = env.array_map(v) {
                    array_maps.push((v, layout));
                }
            }
        }
        if callx {
            // Mirrors `LoweringTarget::callx_helpers`: callx may reach any of them.
            ids.extend(0..256);
        }
        ids.sort_unstable();
        ids.dedup();
        CacheKey {
            insns: insns.to_vec(),
            helpers: ids.into_iter().map(|id| (id, env.helper(id))).collect(),
            array_maps,
            cpu_number_offset: env.cpu_number_offset(),
            cpu_slots: env.cpu_slots(),
            opts: opts.clone(),
        }
    }
}

/// A compile cache. Entries live as long as the cache; a program handed out stays valid
/// after the cache is dropped.
#[derive(Default)]
pub struct JitCache {
    entries: Mutex<HashMap<CacheKey, JitProgram>>,
}

impl JitCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the cached program for this bytecode, helper set and map layouts, compiling
    /// on a miss.
    pub fn get_or_compile(
        &self,
        insns: &[Insn],
        env: &dyn JitEnv,
        opts: &JitOptions,
    ) -> Result<JitProgram, JitError> {
        let key = CacheKey::new(insns, env, opts);
        if let Some(p) = self.lock().get(&key) {
            debug!(insns = insns.len(), "JIT cache hit");
            return Ok(p.clone());
        }
        // Compile outside the lock; a racing duplicate compile is harmless.
        let program = JitProgram::compile_with(insns, env, opts)?;
        self.lock().entry(key).or_insert_with(|| program.clone());
        Ok(program)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, JitProgram>> {
        // A panic while holding the lock cannot leave the map half-updated.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
