//! Programs as the agent runs them: map references relocated to this
//! process's map handles, executed by the interpreter.

use bpftime_interpreter::{execute, Environment, MemoryPolicy};
use bpftime_isa::{opcode as op, HelperFn, Insn};
use bpftime_runtime::{helpers, Map, ProgramRecord, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A program ready to run in this process.
pub(crate) struct LoadedProgram {
    pub(crate) name: String,
    pub(crate) insns: Arc<[Insn]>,
    /// Keeps the maps the relocated instructions point at alive.
    _maps: Vec<Arc<Map>>,
}

/// Programs loaded in this process, by store id (tail calls look them up).
#[derive(Default)]
pub(crate) struct Programs {
    by_id: Mutex<HashMap<u32, Arc<LoadedProgram>>>,
    maps: Mutex<HashMap<u32, Arc<Map>>>,
}

impl Programs {
    fn map(&self, store: &Store, id: u32) -> Result<Arc<Map>, String> {
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = maps.get(&id) {
            return Ok(m.clone());
        }
        let m = Arc::new(Map::open(store, id).map_err(|e| format!("map {id}: {e}"))?);
        maps.insert(id, m.clone());
        Ok(m)
    }

    pub(crate) fn load(&self, store: &Store, id: u32) -> Result<Arc<LoadedProgram>, String> {
        if let Some(p) = self
            .by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            return Ok(p.clone());
        }
        let rec = ProgramRecord::read(store, id).map_err(|e| format!("program {id}: {e}"))?;
        let mut insns = rec.insns.clone();
        let mut maps = Vec::new();
        let mut pc = 0;
        while pc < insns.len() {
            let i = insns[pc];
            if i.is_lddw() && pc + 1 < insns.len() {
                if matches!(i.src, op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE) {
                    let m = self.map(store, i.imm as u32)?;
                    let addr = if i.src == op::PSEUDO_MAP_FD {
                        Arc::as_ptr(&m) as u64
                    } else {
                        // SAFETY: a 4-byte key on the stack; map values are looked up by index 0.
                        let base = unsafe { m.prog_lookup(0u32.to_ne_bytes().as_ptr()) };
                        if base.is_null() {
                            return Err(format!("program {}: map value reference into map {} which has no element 0", rec.name, m.id()));
                        }
                        base as u64 + insns[pc + 1].imm as u32 as u64
                    };
                    insns[pc].src = 0;
                    insns[pc].imm = addr as u32 as i32;
                    insns[pc + 1].imm = (addr >> 32) as u32 as i32;
                    maps.push(m);
                }
                pc += 2;
            } else {
                pc += 1;
            }
        }
        let loaded = Arc::new(LoadedProgram {
            name: rec.name,
            insns: insns.into(),
            _maps: maps,
        });
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, loaded.clone());
        Ok(loaded)
    }
}

/// What programs see of the runtime while they run.
pub(crate) struct Runtime {
    pub(crate) store: Store,
    pub(crate) programs: Programs,
}

// SAFETY: every helper is a runtime helper written for verified programs'
// arguments; tail-call targets are programs this agent loaded.
unsafe impl Environment for Runtime {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        helpers::helper_by_id(id)
    }

    fn tail_call_target(&self, map: u64, index: u64) -> Option<Arc<[Insn]>> {
        // SAFETY: r1 of bpf_tail_call is a prog_array Map address the loader relocated.
        let m = unsafe { &*(map as *const Map) };
        let id = m.id_at(u32::try_from(index).ok()?)?;
        self.programs
            .load(&self.store, id)
            .ok()
            .map(|p| p.insns.clone())
    }
}

impl Runtime {
    /// Runs a program on a probe's registers.
    pub(crate) fn run(&self, prog: &LoadedProgram, ctx: u64) {
        // SAFETY: programs were checked when they were loaded into the store.
        let policy = unsafe { MemoryPolicy::unchecked() };
        if let Err(e) = execute(&prog.insns, ctx, 0, self, &policy) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            let name = prog.name.clone();
            ONCE.call_once(|| tracing::error!(program = %name, "program failed: {e}"));
        }
    }
}
