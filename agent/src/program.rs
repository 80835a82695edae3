//! Programs as the agent runs them: verified against this process's view of
//! their maps, map references relocated to this process's map handles, and
//! JIT-compiled (the interpreter runs them where the JIT cannot).

use bpftime_interpreter::{execute, Environment, MemoryPolicy};
use bpftime_isa::uapi::{helper, prog_type};
use bpftime_isa::{opcode as op, HelperFn, Insn};
use bpftime_jit_x86::{
    ArrayMapLayout, CpuSlotTable, JitCache, JitEnv, JitOptions, JitProgram, PerCpuCopies,
    FS_SEGMENT,
};
use bpftime_prepare::MapRef;
use bpftime_runtime::{cpu_slots, helpers, Map, ProgramRecord, Store};
use bpftime_verifier::{verify, Options, ProgramInfo, Verified};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Set to `0` (or `interpreter`) in a target's environment to run its programs on
/// the interpreter instead of the JIT.
pub(crate) use bpftime_abi::JIT_ENV;

/// A program ready to run in this process.
pub(crate) struct LoadedProgram {
    pub(crate) name: String,
    /// The relocated bytecode: what the interpreter runs and the JIT compiled.
    pub(crate) insns: Arc<[Insn]>,
    /// Machine code; `None` where the program runs on the interpreter.
    pub(crate) jit: Option<JitProgram>,
    /// The words of its context (`pt_regs`) it may read, as the verifier found them.
    pub(crate) ctx_words_read: u64,
    /// Whether it runs as a CPU slot it holds alone (see `bpftime_runtime::cpu_slots`):
    /// it reaches per-CPU values or asks for the CPU number.
    runs_as_cpu: bool,
    /// Keeps the maps the relocated instructions point at alive.
    _maps: Vec<Arc<Map>>,
}

impl LoadedProgram {
    /// The maps the program uses.
    pub(crate) fn maps(&self) -> &[Arc<Map>] {
        &self._maps
    }

    /// Whether the program runs as a CPU slot (it uses the store's CPU slot table).
    pub(crate) fn runs_as_cpu(&self) -> bool {
        self.runs_as_cpu
    }
}

/// Programs loaded in this process, by store id (tail calls look them up).
pub(crate) struct Programs {
    by_id: Mutex<HashMap<u32, Arc<LoadedProgram>>>,
    maps: Mutex<HashMap<u32, Arc<Map>>>,
    jit: Option<JitCache>,
}

impl Programs {
    pub(crate) fn new(use_jit: bool) -> Self {
        Programs {
            by_id: Mutex::default(),
            maps: Mutex::default(),
            jit: use_jit.then(JitCache::new),
        }
    }

    pub(crate) fn map(&self, store: &Store, id: u32) -> Result<Arc<Map>, String> {
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
        let ctx_words_read = self.verify(store, &rec)?.ctx_words_read;
        let (insns, maps) = self.relocate(store, &rec)?;
        let runs_as_cpu = maps.iter().any(|m| m.reaches_per_cpu_values())
            || calls_helper(&insns, helper::GET_SMP_PROCESSOR_ID);
        let env = CompileEnv {
            maps: &maps,
            runs_as_cpu,
        };
        let jit = self.jit.as_ref().and_then(|cache| {
            match cache.get_or_compile(&insns, &env, &JitOptions::default()) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(program = %rec.name, "the JIT cannot compile this program, so the interpreter runs it: {e}");
                    None
                }
            }
        });
        tracing::info!(
            program = %rec.name,
            insns = insns.len(),
            engine = if jit.is_some() { "x86-64 JIT" } else { "interpreter" },
            "loaded"
        );
        let loaded = Arc::new(LoadedProgram {
            name: rec.name,
            insns: insns.into(),
            jit,
            ctx_words_read,
            runs_as_cpu,
            _maps: maps,
        });
        Ok(self
            .by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert(loaded)
            .clone())
    }

    /// The store is a directory any process of the user can write, so a program
    /// is verified again here, against the context the agent gives it (a uprobe's
    /// `pt_regs`), before it runs.
    fn verify(&self, store: &Store, rec: &ProgramRecord) -> Result<Verified, String> {
        self.verify_with(store, rec, false)
    }

    /// [`verify`](Self::verify) under the GPU rules, for a program spliced into CUDA
    /// kernels (its context is kprobe-shaped too).
    pub(crate) fn verify_for_gpu(&self, store: &Store, rec: &ProgramRecord) -> Result<(), String> {
        self.verify_with(store, rec, true).map(|_| ())
    }

    fn verify_with(
        &self,
        store: &Store,
        rec: &ProgramRecord,
        gpu: bool,
    ) -> Result<Verified, String> {
        let mut maps = HashMap::new();
        for &m in &rec.map_ids {
            maps.insert(m, self.map(store, m)?);
        }
        // A tracepoint's program is checked against its record, a raw tracepoint's against
        // its arguments; every other program the agent runs gets a pt_regs.
        let checked_as = match rec.prog_type {
            prog_type::TRACEPOINT | prog_type::RAW_TRACEPOINT if !gpu => rec.prog_type,
            _ => prog_type::KPROBE,
        };
        let info = ProgramInfo {
            insns: &rec.insns,
            prog_type: checked_as,
            gpu,
            maps: &|imm: i32| bpftime_prepare::desc_of(&maps, imm as u32),
            mem_len: 0,
        };
        verify(&info, &Options::default())
            .map_err(|r| format!("program {} fails verification:\n{}", rec.name, r.log()))
    }

    /// Turns store map ids in `lddw`s into this process's map handles.
    fn relocate(
        &self,
        store: &Store,
        rec: &ProgramRecord,
    ) -> Result<(Vec<Insn>, Vec<Arc<Map>>), String> {
        let mut maps = Vec::new();
        let insns = bpftime_prepare::relocate(&rec.insns, |r| {
            let m = self.map(store, r.map())?;
            let addr = match r {
                MapRef::Map(_) => Arc::as_ptr(&m) as u64,
                MapRef::Value { offset, .. } => {
                    // SAFETY: a 4-byte key on the stack; map values are looked up by index 0.
                    let base = unsafe { m.prog_lookup(0u32.to_ne_bytes().as_ptr()) };
                    if base.is_null() {
                        return Err(format!(
                            "program {}: map value reference into map {} which has no element 0",
                            rec.name,
                            m.id()
                        ));
                    }
                    base as u64 + u64::from(offset)
                }
            };
            maps.push(m);
            Ok(addr)
        })?;
        Ok((insns, maps))
    }
}

/// What the JIT needs from this process: helper addresses, the tail-call
/// resolver, and where array maps keep their values.
struct CompileEnv<'a> {
    maps: &'a [Arc<Map>],
    runs_as_cpu: bool,
}

impl JitEnv for CompileEnv<'_> {
    fn helper(&self, id: u32) -> Option<u64> {
        if id == helper::TAIL_CALL {
            let resolver: HelperFn = resolve_tail_call;
            return Some(resolver as usize as u64);
        }
        helpers::helper_by_id(id).map(|f| f as usize as u64)
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        let m = self.maps.iter().find(|m| Arc::as_ptr(m) as u64 == map)?;
        array_layout(m)
    }

    fn cpu_number_offset(&self) -> Option<u64> {
        bpftime_runtime::cpu_number_offset()
    }

    fn cpu_slots(&self) -> Option<CpuSlotTable> {
        if !self.runs_as_cpu {
            return None;
        }
        let t = cpu_slots::slot_table()?;
        Some(CpuSlotTable {
            address_space: FS_SEGMENT,
            slot_offset: t.slot_tp_offset,
            ids_offset: t.ids_tp_offset,
            rseq_offset: t.rseq_tp_offset,
            slots: t.slots,
            stride: t.stride,
            cpus: t.cpus,
            claim_own: t.claim_own,
            claim: t.claim,
        })
    }
}

/// Whether `insns` call helper `id` (a relocated `lddw` never looks like a call).
fn calls_helper(insns: &[Insn], id: u32) -> bool {
    insns
        .iter()
        .any(|i| i.code == op::CALL_INSN && i.src == op::CALL_HELPER && i.imm as u32 == id)
}

/// How the JIT sees an array map of this process, for inlined lookups and updates.
fn array_layout(m: &Map) -> Option<ArrayMapLayout> {
    let v = m.array_values()?;
    Some(ArrayMapLayout {
        values: v.base as u64,
        key_stride: v.key_stride,
        max_entries: m.max_entries(),
        update_size: v.value_size,
        per_cpu: v
            .per_cpu
            .map(|(cpus, stride)| PerCpuCopies { cpus, stride }),
    })
}

/// The runtime tail calls resolve against (there is one agent per process).
static ACTIVE: OnceLock<Arc<Runtime>> = OnceLock::new();

/// `bpf_tail_call` for JIT code: the entry of the program at `index` of the
/// prog_array `map`, or 0 (the call then falls through, as in the kernel).
unsafe extern "C" fn resolve_tail_call(_ctx: u64, map: u64, index: u64, _: u64, _: u64) -> u64 {
    // SAFETY: forwarded from JIT code (see below).
    bpftime_ffi_guard::ffi_guard!("bpf_tail_call", 0, unsafe { tail_call_target(map, index) })
}

/// # Safety
/// `map` is a prog_array `Map` address this agent relocated into the program.
unsafe fn tail_call_target(map: u64, index: u64) -> u64 {
    let Some(rt) = ACTIVE.get() else { return 0 };
    // SAFETY: r2 of bpf_tail_call is a prog_array `Map` address this agent relocated
    // into the program, kept alive by the program's map list.
    let m = unsafe { &*(map as *const Map) };
    let Some(id) = u32::try_from(index).ok().and_then(|i| m.id_at(i)) else {
        return 0;
    };
    match rt.programs.load(&rt.store, id) {
        Ok(p) => match &p.jit {
            Some(code) => code.entry_address(),
            None => {
                tracing::warn!(program = %p.name, "tail call into a program the JIT could not compile: it fails");
                0
            }
        },
        Err(e) => {
            tracing::warn!("tail call target {id}: {e}");
            0
        }
    }
}

/// What programs see of the runtime while they run.
pub(crate) struct Runtime {
    pub(crate) store: Store,
    pub(crate) programs: Programs,
}

// SAFETY: every helper is a runtime helper written for verified programs'
// arguments; tail-call targets are programs this agent loaded and verified.
unsafe impl Environment for Runtime {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        helpers::helper_by_id(id)
    }

    fn tail_call_target(&self, map: u64, index: u64) -> Option<Arc<[Insn]>> {
        // SAFETY: r2 of bpf_tail_call is a prog_array Map address the loader relocated.
        let m = unsafe { &*(map as *const Map) };
        let id = m.id_at(u32::try_from(index).ok()?)?;
        self.programs
            .load(&self.store, id)
            .ok()
            .map(|p| p.insns.clone())
    }
}

impl Runtime {
    /// Makes this the runtime JIT-compiled tail calls resolve against.
    pub(crate) fn activate(self: &Arc<Self>) {
        let _ = ACTIVE.set(self.clone());
    }

    /// Runs a program on a probe's registers.
    pub(crate) fn run(&self, prog: &LoadedProgram, ctx: u64) {
        if let Some(code) = &prog.jit {
            // SAFETY: the program was verified against a pt_regs context, which `ctx`
            // points to; its maps and helpers live as long as `prog`.
            unsafe { code.call(ctx, 0) };
            return;
        }
        // JIT code takes its slot itself.
        let _slot = prog.runs_as_cpu.then(cpu_slots::SlotGuard::take);
        // SAFETY: the program was verified when this agent loaded it.
        let policy = unsafe { MemoryPolicy::unchecked() };
        if let Err(e) = execute(&prog.insns, ctx, 0, self, &policy) {
            static ONCE: std::sync::Once = std::sync::Once::new();
            let name = prog.name.clone();
            ONCE.call_once(|| tracing::error!(program = %name, "program failed: {e}"));
        }
    }
}

/// Whether this process asked for the JIT (the default).
pub(crate) fn jit_wanted() -> bool {
    !matches!(
        std::env::var(JIT_ENV).as_deref(),
        Ok("0") | Ok("interpreter") | Ok("off")
    )
}
