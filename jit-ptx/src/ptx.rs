use std::sync::OnceLock;
use std::time::Instant;

use bpftime_isa::Insn;
use bpftime_lifter::optimize;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetData, TargetMachine,
    TargetTriple,
};
use inkwell::values::{FunctionValue, IntValue};
use tracing::debug;

use crate::gpu::{
    array_extents, build_module, call_int, demote_stack_atomics, extern_functions,
    fold_guarded_ctlz, fold_known_in_range, fold_smeared_ctlz, fold_stack_pointer_casts,
    fold_uniform_warp_ops, intrinsic, Axis, Dimension, GpuBackend, GpuEnv, GpuModule, OptLevel,
    ProbeAbi, SpecialRegister,
};
use crate::CompileError;

const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// A PTX ISA version, the `.version` line of the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxVersion {
    pub major: u32,
    pub minor: u32,
}

impl PtxVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        PtxVersion { major, minor }
    }

    /// The default: the oldest version that knows every architecture we target
    /// (sm_89 and sm_90 need 7.8), so the PTX loads on any driver since CUDA 11.8.
    pub const DEFAULT: PtxVersion = PtxVersion::new(7, 8);

    /// The newest version LLVM 19 writes. The device's driver (580, CUDA 13.0) reads
    /// up to 9.0, so every version LLVM writes loads there.
    pub const NEWEST: PtxVersion = PtxVersion::new(8, 5);

    fn known_to_llvm(self) -> bool {
        matches!(
            (self.major, self.minor),
            (6, 0..=5) | (7, 0..=8) | (8, 0..=5)
        )
    }

    fn feature(self) -> String {
        format!("+ptx{}{}", self.major, self.minor)
    }
}

impl std::fmt::Display for PtxVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The architectures we compile for, with the oldest PTX version that knows each.
const ARCHITECTURES: &[(u32, PtxVersion)] = &[
    (70, PtxVersion::new(6, 0)),
    (72, PtxVersion::new(6, 1)),
    (75, PtxVersion::new(6, 3)),
    (80, PtxVersion::new(7, 0)),
    (86, PtxVersion::new(7, 1)),
    (87, PtxVersion::new(7, 4)),
    (89, PtxVersion::new(7, 8)),
    (90, PtxVersion::new(7, 8)),
];

/// How to compile for PTX.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PtxOptions {
    /// The `sm_XY` architecture, as `XY`: 70, 72, 75, 80, 86, 87, 89 or 90.
    pub sm: u32,
    /// The `.version` of the output; at least what `sm` needs.
    pub ptx_version: PtxVersion,
    pub opt_level: OptLevel,
    /// Name of the probe function; the kernel is `<symbol>_kernel`.
    pub symbol: String,
    /// Also write the stand-alone kernel (the conformance runner's way in); a probe
    /// spliced into someone else's kernel needs only the function.
    pub kernel: bool,
    /// How the probe function takes its context.
    pub probe_abi: ProbeAbi,
}

impl Default for PtxOptions {
    fn default() -> Self {
        PtxOptions {
            sm: 90,
            ptx_version: PtxVersion::DEFAULT,
            opt_level: OptLevel::default(),
            symbol: "bpf_prog".to_string(),
            kernel: true,
            probe_abi: ProbeAbi::Context,
        }
    }
}

impl PtxOptions {
    fn check(&self) -> Result<(), CompileError> {
        let invalid = |message: String| Err(CompileError::InvalidOption { message });
        let Some(&(_, oldest)) = ARCHITECTURES.iter().find(|(sm, _)| *sm == self.sm) else {
            let known: Vec<String> = ARCHITECTURES
                .iter()
                .map(|(sm, _)| format!("sm_{sm}"))
                .collect();
            return invalid(format!(
                "sm_{} is not a target; pick one of {}",
                self.sm,
                known.join(", ")
            ));
        };
        if !self.ptx_version.known_to_llvm() {
            return invalid(format!(
                "PTX {} is not a version LLVM 19 writes; pick one from 6.0 to {}",
                self.ptx_version,
                PtxVersion::NEWEST
            ));
        }
        if self.ptx_version < oldest {
            return invalid(format!(
                "sm_{} needs PTX {oldest} or newer, not {}",
                self.sm, self.ptx_version
            ));
        }
        Ok(())
    }
}

/// A program compiled to PTX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxProgram {
    /// The PTX module, as text.
    pub ptx: String,
    /// The probe function: `.visible .func (.param .b64 r0) func(.param .b64 ctx)`.
    pub func: String,
    /// The kernel, when [`PtxOptions::kernel`] asked for it: `.visible .entry
    /// kernel(.param .u64 mem, .param .u64 len, .param .u64 result)`.
    pub kernel: Option<String>,
    /// Device functions the PTX calls but does not define (`.extern .func`), which the
    /// GPU runtime must link; while any remain, `ptxas` needs `-c` and the driver
    /// needs a link step.
    pub externs: Vec<String>,
    /// The `.visible .global .u64` that `ktime_get_ns` adds to `%globaltimer`, when the
    /// program calls it: write (host `CLOCK_MONOTONIC` − `%globaltimer`) in nanoseconds
    /// into it after loading the module, or timestamps stay on the GPU's own clock.
    pub clock_offset: Option<String>,
}

struct Nvptx {
    data_layout: String,
}

impl Nvptx {
    fn for_machine(machine: &TargetMachine) -> Self {
        let layout = machine.get_target_data().get_data_layout();
        Nvptx {
            data_layout: layout.as_str().to_string_lossy().into_owned(),
        }
    }

    fn sreg<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
        name: &str,
    ) -> Result<IntValue<'ctx>, CompileError> {
        let f: FunctionValue = intrinsic(module, &format!("llvm.nvvm.read.ptx.sreg.{name}"), &[])?;
        let v = call_int(builder, f, &[], name)?;
        let i64t = module.get_context().i64_type();
        Ok(builder.build_int_z_extend_or_bit_cast(v, i64t, "sreg64")?)
    }
}

impl GpuBackend for Nvptx {
    fn prepare(&self, module: &Module<'_>) {
        module.set_triple(&TargetTriple::create(TRIPLE));
        module.set_data_layout(&TargetData::create(&self.data_layout).get_data_layout());
    }

    fn read_register<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
        reg: SpecialRegister,
    ) -> Result<IntValue<'ctx>, CompileError> {
        let name = match reg {
            SpecialRegister::GlobalTimerNs => "globaltimer".to_string(),
            SpecialRegister::SmId => "smid".to_string(),
            SpecialRegister::WarpId => "warpid".to_string(),
            SpecialRegister::LaneId => "laneid".to_string(),
            SpecialRegister::Dim(dim, axis) => {
                let base = match dim {
                    Dimension::ThreadIdx => "tid",
                    Dimension::BlockIdx => "ctaid",
                    Dimension::BlockDim => "ntid",
                    Dimension::GridDim => "nctaid",
                };
                format!("{base}.{}", Axis::letter(axis))
            }
        };
        self.sreg(module, builder, &name)
    }

    fn membar<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
    ) -> Result<(), CompileError> {
        // LLVM 19's NVPTX backend cannot select an IR `fence`; `membar.sys` is what
        // bpftime's helper means anyway.
        let f = intrinsic(module, "llvm.nvvm.membar.sys", &[])?;
        builder.build_call(f, &[], "")?;
        Ok(())
    }

    fn mark_kernel<'ctx>(
        &self,
        module: &Module<'ctx>,
        kernel: FunctionValue<'ctx>,
    ) -> Result<(), CompileError> {
        // LLVM 19 knows kernels by this annotation (`!{ptr @k, !"kernel", i32 1}`).
        let context = module.get_context();
        let node = context.metadata_node(&[
            kernel.as_global_value().as_pointer_value().into(),
            context.metadata_string("kernel").into(),
            context.i32_type().const_int(1, false).into(),
        ]);
        module
            .add_global_metadata("nvvm.annotations", &node)
            .map_err(|e| CompileError::InvalidIr {
                message: e.to_string(),
            })
    }
}

fn nvptx_machine(opts: &PtxOptions) -> Result<TargetMachine, CompileError> {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| Target::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create(TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| CompileError::Target {
        message: e.to_string(),
    })?;
    target
        .create_target_machine(
            &triple,
            &format!("sm_{}", opts.sm),
            &opts.ptx_version.feature(),
            opts.opt_level.codegen(),
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| CompileError::Target {
            message: format!(
                "LLVM cannot make an NVPTX target machine for sm_{}",
                opts.sm
            ),
        })
}

/// `ptx` without the NVPTX backend's `// callseq N` comments. Their numbers count calls
/// lowered by every compilation in the process so far, so the same program would be
/// different text in each; the driver's JIT cache keys on the text.
fn without_call_numbers(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        match line.find("// callseq") {
            Some(at) => {
                out.push_str(line[..at].trim_end());
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// The optimized LLVM IR [`compile`] would turn into PTX, as text.
pub fn lifted_ir(
    insns: &[Insn],
    env: &dyn GpuEnv,
    opts: &PtxOptions,
) -> Result<String, CompileError> {
    opts.check()?;
    let _llvm = bpftime_lifter::llvm_in_use()?;
    let context = Context::create();
    let machine = nvptx_machine(opts)?;
    let gpu = optimized_module(&context, &machine, insns, env, opts)?;
    Ok(gpu.module.print_to_string().to_string())
}

/// The lifted module of `insns`, optimized for `machine`: what PTX is emitted from.
fn optimized_module<'ctx>(
    context: &'ctx Context,
    machine: &TargetMachine,
    insns: &[Insn],
    env: &dyn GpuEnv,
    opts: &PtxOptions,
) -> Result<GpuModule<'ctx>, CompileError> {
    let gpu = build_module(
        context,
        insns,
        env,
        &Nvptx::for_machine(machine),
        &opts.symbol,
        opts.kernel,
        &opts.probe_abi,
    )?;
    // The linked device runtime's unused functions go first, so the pipeline never
    // looks at them.
    optimize(&gpu.module, machine, "globaldce")?;
    optimize(&gpu.module, machine, opts.opt_level.pipeline())?;
    if matches!(opts.probe_abi, ProbeAbi::Arguments { .. })
        && fold_stack_pointer_casts(&gpu.module)? > 0
    {
        // SROA twice: the first leaves the context's slots in memory wherever a pointer
        // to them still goes through a phi or select, which instcombine and simplifycfg
        // then clear (memtrace's context stayed in local memory with one round).
        optimize(
            &gpu.module,
            machine,
            "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,adce)",
        )?;
    }
    // Each round's folding makes the next shuffle's operand a constant (a warp sum of a
    // constant doubles at every step), so it goes round until nothing is left to fold.
    let uniform: Vec<_> = match (&opts.probe_abi, gpu.module.get_function(&gpu.func)) {
        (ProbeAbi::Arguments { uniform, .. }, Some(f)) => f
            .get_param_iter()
            .enumerate()
            .filter(|&(i, _)| i < 64 && uniform & (1 << i) != 0)
            .map(|(_, p)| p)
            .collect(),
        _ => Vec::new(),
    };
    let extents = array_extents(&env.array_maps());
    for _ in 0..8 {
        let folded = fold_uniform_warp_ops(&gpu.module, &uniform)?
            + fold_known_in_range(&gpu.module, &extents)?
            + fold_smeared_ctlz(&gpu.module)?
            + fold_guarded_ctlz(&gpu.module)?;
        if folded == 0 {
            break;
        }
        optimize(
            &gpu.module,
            machine,
            "function(instcombine<no-verify-fixpoint>,correlated-propagation,instcombine<no-verify-fixpoint>,simplifycfg,adce)",
        )?;
    }
    demote_stack_atomics(&gpu.module)?;
    Ok(gpu)
}

/// Compiles `insns` to a PTX module with the helpers, maps and library `env` gives.
pub fn compile(
    insns: &[Insn],
    env: &dyn GpuEnv,
    opts: &PtxOptions,
) -> Result<PtxProgram, CompileError> {
    opts.check()?;
    let _llvm = bpftime_lifter::llvm_in_use()?;
    let started = Instant::now();
    let context = Context::create();
    let machine = nvptx_machine(opts)?;
    let gpu = optimized_module(&context, &machine, insns, env, opts)?;
    let externs = extern_functions(&gpu.module);
    let buffer = machine
        .write_to_memory_buffer(&gpu.module, FileType::Assembly)
        .map_err(|e| CompileError::Codegen {
            message: e.to_string(),
        })?;
    let ptx = String::from_utf8(buffer.as_slice().to_vec()).map_err(|e| CompileError::Codegen {
        message: format!("PTX is not UTF-8: {e}"),
    })?;
    // PTX text must not carry the NUL that LLVM's buffers may end with.
    let ptx = without_call_numbers(ptx.trim_end_matches('\0'));
    debug!(
        insns = insns.len(),
        ptx_bytes = ptx.len(),
        sm = opts.sm,
        us = started.elapsed().as_micros() as u64,
        "compiled eBPF program to PTX"
    );
    Ok(PtxProgram {
        ptx,
        func: gpu.func,
        kernel: gpu.kernel,
        clock_offset: gpu.clock_offset,
        externs,
    })
}
