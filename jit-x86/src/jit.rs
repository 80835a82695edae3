use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bpftime_isa::opcode as op;
use bpftime_isa::Insn;
use bpftime_lifter::{
    lift, optimize, ArrayMapLayout, CpuNumber, CpuSlotTable, HelperLowering, Lifted,
    LoweringTarget, DEFAULT_ENTRY_NAME,
};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::OptimizationLevel;
use tracing::debug;

use crate::loader::{load, LoadedCode};
use crate::JitError;

/// Signature of a compiled program's entry, as found at [`JitProgram::entry_address`]:
/// `r0 = entry(r1, r2, tail_depth)`. Tail-call resolvers return such addresses; outside
/// callers pass `tail_depth = 0`.
pub type EntryFn = unsafe extern "C" fn(r1: u64, r2: u64, tail_depth: u64) -> u64;

/// How hard LLVM works.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptLevel {
    O0,
    /// SROA, early CSE, instcombine and CFG cleanup only: registers and stack slots
    /// become SSA values, which is most of what O2 buys a short probe, for far less time.
    /// As a code generator level it means `O1`.
    Light,
    O1,
    O2,
    O3,
}

impl OptLevel {
    fn pipeline(self) -> &'static str {
        match self {
            OptLevel::O0 => "default<O0>",
            OptLevel::Light => {
                "always-inline,function(sroa<modify-cfg>,early-cse,instcombine<no-verify-fixpoint>,simplifycfg)"
            }
            OptLevel::O1 => "default<O1>",
            OptLevel::O2 => "default<O2>",
            OptLevel::O3 => "default<O3>",
        }
    }

    fn codegen(self) -> OptimizationLevel {
        match self {
            OptLevel::O0 => OptimizationLevel::None,
            OptLevel::Light | OptLevel::O1 => OptimizationLevel::Less,
            OptLevel::O2 => OptimizationLevel::Default,
            OptLevel::O3 => OptimizationLevel::Aggressive,
        }
    }
}

/// Compilation options.
///
/// The default is what probes attach with: `Light` IR passes, then `O1` code generation
/// (SelectionDAG and the greedy register allocator). `O0` code generation (fast
/// instruction selection and register allocation) compiles a 32-slot tracing program in
/// about a third of the time (0.65 against 1.8 ms on the 2-core dev VM), but keeps every
/// value in a stack slot: bpftrace's `count()` ran about 120 instructions with a 616-byte frame,
/// and each hit cost 1.8 ns more than with `O1` (per-CPU count 10.35 against 8.51 ns per
/// call; funclatency 103.1 against 100.5, medians of alternated runs). A program is
/// compiled once per process and runs for every hit, so the hits win. Figures:
/// `benches/compile.rs`, `benches/engines.rs`, BENCHMARKS.md.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JitOptions {
    /// The IR pass pipeline.
    pub opt_level: OptLevel,
    /// The code generator's level; `O0` selects fast instruction selection and the fast
    /// register allocator.
    pub codegen_level: OptLevel,
    /// The code generator's level for programs with no backward jump or call (no loop,
    /// no recursion); `None` uses `codegen_level` for every program.
    pub loop_free_codegen_level: Option<OptLevel>,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            opt_level: OptLevel::Light,
            codegen_level: OptLevel::O1,
            loop_free_codegen_level: None,
        }
    }
}

impl JitOptions {
    /// `default<O2>` and the code generator's default level, for long-lived hot programs.
    pub fn optimized() -> Self {
        JitOptions {
            opt_level: OptLevel::O2,
            codegen_level: OptLevel::O2,
            loop_free_codegen_level: None,
        }
    }

    /// The cheapest compile: no IR passes, fast instruction selection.
    pub fn fastest() -> Self {
        JitOptions {
            opt_level: OptLevel::O0,
            codegen_level: OptLevel::O0,
            loop_free_codegen_level: None,
        }
    }

    /// The code generator's level for `insns`.
    fn codegen_level_for(&self, insns: &[Insn]) -> OptLevel {
        match self.loop_free_codegen_level {
            Some(level) if !has_backward_edge(insns) => level,
            _ => self.codegen_level,
        }
    }
}

/// Whether any jump or bpf-to-bpf call goes backwards (to itself or an earlier slot): the
/// only ways eBPF code can run an instruction twice in one invocation.
fn has_backward_edge(insns: &[Insn]) -> bool {
    let mut pc = 0;
    while pc < insns.len() {
        let i = &insns[pc];
        if i.is_lddw() {
            pc += 2;
            continue;
        }
        let class = i.class();
        if class == op::JMP || class == op::JMP32 {
            let operation = i.code & op::OP_MASK;
            let offset = match operation {
                op::EXIT => None,
                op::CALL if i.src == op::CALL_PSEUDO => Some(i64::from(i.imm)),
                op::CALL => None,
                // `gotol` carries its offset in imm.
                op::JA if class == op::JMP32 => Some(i64::from(i.imm)),
                _ => Some(i64::from(i.off)),
            };
            if offset.is_some_and(|o| o < 0) {
                return true;
            }
        }
        pc += 1;
    }
    false
}

/// What the runtime supplies at compile time.
pub trait JitEnv {
    /// Address of helper `id`, an `extern "C" fn(u64, u64, u64, u64, u64) -> u64`; for id
    /// 12 (`bpf_tail_call`), the tail-call resolver, which has the same signature and
    /// returns an [`EntryFn`] address or 0 (see `bpftime-lifter`).
    fn helper(&self, id: u32) -> Option<u64>;

    /// Layout of the array map at address `map` (as an `lddw` loads it), to inline its
    /// lookups and updates; `None` keeps the helper calls.
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        let _ = map;
        None
    }

    /// Offset from the FS segment base of a `u32` holding the CPU the thread runs on (the
    /// `cpu_id` of glibc's rseq area), to inline per-CPU array accesses; `None` keeps
    /// their helper calls.
    fn cpu_number_offset(&self) -> Option<u64> {
        None
    }

    /// Where the program takes a CPU slot to run as (see [`CpuSlotTable`], its offsets
    /// in [`FS_SEGMENT`]); `None` runs it as whatever CPU the thread is on. Per-CPU
    /// accesses then read the slot, not [`cpu_number_offset`](Self::cpu_number_offset).
    fn cpu_slots(&self) -> Option<CpuSlotTable> {
        None
    }
}

impl<F: Fn(u32) -> Option<u64>> JitEnv for F {
    fn helper(&self, id: u32) -> Option<u64> {
        self(id)
    }
}

/// A bare helper table, for [`JitProgram::compile`].
struct Helpers<'a>(&'a dyn Fn(u32) -> Option<u64>);

impl JitEnv for Helpers<'_> {
    fn helper(&self, id: u32) -> Option<u64> {
        (self.0)(id)
    }
}

/// Helpers are plain addresses in this process.
struct HostTarget<'a> {
    env: &'a dyn JitEnv,
}

impl LoweringTarget for HostTarget<'_> {
    fn helper(&self, id: u32) -> Option<HelperLowering> {
        self.env.helper(id).map(HelperLowering::Address)
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.env.array_map(map)
    }

    fn cpu_number(&self) -> Option<CpuNumber> {
        self.env.cpu_number_offset().map(|offset| CpuNumber {
            address_space: FS_SEGMENT,
            offset,
        })
    }

    fn cpu_slots(&self) -> Option<CpuSlotTable> {
        self.env.cpu_slots()
    }

    fn slow_path_call_wrapper(&self) -> Option<u64> {
        Some(crate::vectors::call_keeping_vectors())
    }
}

/// LLVM's x86 address space for FS-relative addresses, where Linux keeps the thread
/// pointer.
pub const FS_SEGMENT: u16 = 257;

fn init_native() -> Result<(), JitError> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| Target::initialize_native(&InitializationConfig::default()))
        .clone()
        .map_err(|message| JitError::Target { message })
}

thread_local! {
    // Creating a target machine costs a noticeable share of a small compile, and one is
    // not `Send`, so each compiling thread keeps its own per level.
    static MACHINES: RefCell<HashMap<OptLevel, Rc<TargetMachine>>> = RefCell::new(HashMap::new());
}

fn host_machine(level: OptLevel) -> Result<Rc<TargetMachine>, JitError> {
    if let Some(m) = MACHINES.with(|m| m.borrow().get(&level).cloned()) {
        return Ok(m);
    }
    init_native()?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| JitError::Target {
        message: e.to_string(),
    })?;
    let cpu = TargetMachine::get_host_cpu_name();
    let features = TargetMachine::get_host_cpu_features();
    let machine = target
        .create_target_machine(
            &triple,
            &cpu.to_string(),
            &features.to_string(),
            level.codegen(),
            // Position-independent code keeps every internal reference PC-relative, so
            // the image can live anywhere the kernel maps it.
            RelocMode::PIC,
            CodeModel::Small,
        )
        .ok_or_else(|| JitError::Target {
            message: format!("cannot create a target machine for {triple}"),
        })?;
    let machine = Rc::new(machine);
    MACHINES.with(|m| m.borrow_mut().insert(level, machine.clone()));
    Ok(machine)
}

fn lift_and_optimize<'ctx>(
    context: &'ctx Context,
    insns: &[Insn],
    env: &dyn JitEnv,
    opts: &JitOptions,
) -> Result<(Lifted<'ctx>, Rc<TargetMachine>), JitError> {
    let lifted = lift(context, insns, &HostTarget { env })?;
    let machine = host_machine(opts.codegen_level_for(insns))?;
    prepare(&lifted.module, &machine);
    optimize(&lifted.module, &machine, opts.opt_level.pipeline())?;
    Ok((lifted, machine))
}

fn prepare(module: &Module<'_>, machine: &TargetMachine) {
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
}

/// The optimized LLVM IR the JIT would compile, as text (for golden files and debugging).
pub fn lifted_ir(insns: &[Insn], env: &dyn JitEnv, opts: &JitOptions) -> Result<String, JitError> {
    let _llvm = bpftime_lifter::llvm_in_use()?;
    let context = Context::create();
    let (lifted, _) = lift_and_optimize(&context, insns, env, opts)?;
    Ok(lifted.module.print_to_string().to_string())
}

/// A compiled program. Clones share the same machine code.
#[derive(Clone)]
pub struct JitProgram {
    code: Arc<LoadedCode>,
    keeps_vector_registers: bool,
}

impl std::fmt::Debug for JitProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitProgram")
            .field("entry", &format_args!("{:#x}", self.entry_address()))
            .field("code_size", &self.code_size())
            .finish()
    }
}

impl JitProgram {
    /// Compiles `insns` for the host with the helpers at the addresses `helpers` gives
    /// (see [`JitEnv::helper`]); an id it does not know fails with
    /// `LiftError::UnknownHelper`, naming the id and the pc.
    pub fn compile(
        insns: &[Insn],
        helpers: &dyn Fn(u32) -> Option<u64>,
        opts: &JitOptions,
    ) -> Result<Self, JitError> {
        Self::compile_with(insns, &Helpers(helpers), opts)
    }

    /// Compiles `insns` for the host with everything `env` supplies.
    pub fn compile_with(
        insns: &[Insn],
        env: &dyn JitEnv,
        opts: &JitOptions,
    ) -> Result<Self, JitError> {
        let _llvm = bpftime_lifter::llvm_in_use()?;
        let started = Instant::now();
        let context = Context::create();
        let (lifted, machine) = lift_and_optimize(&context, insns, env, opts)?;
        let lifted_at = started.elapsed();
        let object = machine
            .write_to_memory_buffer(&lifted.module, FileType::Object)
            .map_err(|e| JitError::Codegen {
                message: e.to_string(),
            })?;
        let code = load(object.as_slice(), DEFAULT_ENTRY_NAME)?;
        let keeps_vector_registers = lifted.plain_calls == 0 && code.keeps_vector_registers();
        debug!(
            insns = insns.len(),
            code_size = code.size(),
            lift_and_optimize_us = lifted_at.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            keeps_vector_registers,
            "compiled eBPF program"
        );
        Ok(JitProgram {
            code: Arc::new(code),
            keeps_vector_registers,
        })
    }

    /// Address of the entry, an [`EntryFn`]; valid while any clone of this program lives.
    pub fn entry_address(&self) -> u64 {
        self.code.entry_address()
    }

    /// Whether a call of the entry leaves xmm0-15 (and every other vector, MMX and x87
    /// register) as it found them, on every path: the code uses none, and its only calls
    /// are the slow paths of inlined map operations, which save them (see
    /// `LoweringTarget::slow_path_call_wrapper`). A hook running the program may then skip
    /// saving them. Programs that call helpers otherwise, or that LLVM compiled with
    /// vector instructions (a large copy, say), say no.
    pub fn keeps_vector_registers(&self) -> bool {
        self.keeps_vector_registers
    }

    /// Bytes of mapped machine code and constants.
    pub fn code_size(&self) -> usize {
        self.code.size()
    }

    /// Runs the program with `r1` and `r2` set and returns r0.
    ///
    /// # Safety
    /// The program dereferences whatever its registers point to and calls its helpers
    /// with whatever it likes: the caller must have verified it against the memory `r1`
    /// and `r2` describe, and every helper and tail-call target must still be alive.
    pub unsafe fn call(&self, r1: u64, r2: u64) -> u64 {
        // SAFETY: `entry_address` points into our read-execute mapping, which `self.code`
        // keeps alive for the duration of the call, at a function the lifter emitted with
        // exactly the `EntryFn` signature and the C calling convention.
        unsafe {
            let entry: EntryFn =
                std::mem::transmute::<usize, EntryFn>(self.entry_address() as usize);
            entry(r1, r2, 0)
        }
    }
}
