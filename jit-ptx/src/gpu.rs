//! The GPU half of lowering, shared by every GPU backend (PTX in this crate, AMDGCN in
//! `bpftime-jit-amdgcn`).
//!
//! A program is lifted once; on a GPU its helpers split three ways:
//! - *builtins*, computed inside the module from the GPU's special registers: helper 5
//!   (`ktime_get_ns`) and 502 read the global timer, 8 (`get_smp_processor_id`) and 509
//!   the SM (compute unit) id, 510 the warp id, 511 the lane id; 503 block index, 504
//!   block size, 505 thread index and 508 grid size write x, y and z as three `u64`s
//!   through r1, r2 and r3 and return 0; 506 is a system-wide memory barrier and
//!   returns 0. Helper 502 is the raw global timer; helper 5 (`ktime_get_ns`) is the
//!   global timer plus the module global [`GpuModule::clock_offset`], which the runtime
//!   sets to its calibrated (host `CLOCK_MONOTONIC` − global timer) before a launch
//!   (docs/ARCHITECTURE.md decision 8), so that GPU and CPU timestamps order correctly. Left at 0 it is
//!   the raw timer.
//! - *extern* helpers ([`extern_helpers`]): calls to device functions that the GPU
//!   runtime links, each with the helper ABI `u64 f(u64, u64, u64, u64, u64)`. PTX
//!   declares them `.extern .func`.
//! - anything else is refused at lift time, naming the helper and the pc.
//!
//! A compiled program has two ways in: the *probe function* `u64 <symbol>(void *ctx)`,
//! which an instrumented kernel calls, and the *kernel* `<symbol>_kernel(void *mem, u64
//! len, u64 *result)`, which runs the program on its own with r1 = mem, r2 = len and
//! stores r0 to `*result`. The eBPF stack is an `alloca`, so it lives in each thread's
//! private memory; eBPF pointers are generic (flat, address space 0) pointers.
//!
//! Every function the module defines besides those two is internal and named
//! `<symbol>__...`, so that modules of several programs can be spliced into one; so is
//! the one global, the clock offset `<symbol>__clock_offset_ns`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use bpftime_isa::helpers::{self, Engine, GpuImpl};
use bpftime_isa::uapi::helper as h;
use bpftime_isa::Insn;
use bpftime_lifter::{lift, ArrayMapLayout, HelperLowering, LoweringTarget};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FunctionValue, IntValue};
use inkwell::AddressSpace;

use crate::CompileError;

/// One coordinate of a three-dimensional launch quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Axis {
    X,
    Y,
    Z,
}

impl Axis {
    pub const ALL: [Axis; 3] = [Axis::X, Axis::Y, Axis::Z];

    pub fn letter(self) -> char {
        match self {
            Axis::X => 'x',
            Axis::Y => 'y',
            Axis::Z => 'z',
        }
    }
}

/// The launch quantities a program can ask for, each with x, y and z.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// The thread's index in its block (`threadIdx`).
    ThreadIdx,
    /// The block's index in the grid (`blockIdx`).
    BlockIdx,
    /// Threads per block (`blockDim`).
    BlockDim,
    /// Blocks per grid (`gridDim`).
    GridDim,
}

/// What a backend must be able to read; every value is returned as an `i64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpecialRegister {
    /// Nanoseconds on the GPU's free-running global clock.
    GlobalTimerNs,
    Dim(Dimension, Axis),
    /// The streaming multiprocessor (NVIDIA) or compute unit (AMD) running the thread.
    SmId,
    /// The warp (wavefront) slot on that SM.
    WarpId,
    /// The thread's lane in its warp (wavefront).
    LaneId,
}

/// A helper computed inside the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Builtin {
    /// r0 = the register.
    Read(SpecialRegister),
    /// `*r1 = x; *r2 = y; *r3 = z`, each a `u64`; r0 = 0.
    Dim3(Dimension),
    /// A memory barrier at system scope; r0 = 0.
    Membar,
    /// r0 = the global timer plus the module's clock offset: nanoseconds on the host's
    /// `CLOCK_MONOTONIC` once the runtime has written the offset.
    HostClockNs,
}

impl Builtin {
    fn symbol(self) -> String {
        let what = match self {
            Builtin::Read(SpecialRegister::GlobalTimerNs) => "globaltimer".to_string(),
            Builtin::Read(SpecialRegister::SmId) => "sm_id".to_string(),
            Builtin::Read(SpecialRegister::WarpId) => "warp_id".to_string(),
            Builtin::Read(SpecialRegister::LaneId) => "lane_id".to_string(),
            Builtin::Read(SpecialRegister::Dim(d, a)) => format!("{d:?}_{}", a.letter()),
            Builtin::Dim3(d) => format!("{d:?}"),
            Builtin::Membar => "membar".to_string(),
            Builtin::HostClockNs => "host_clock_ns".to_string(),
        };
        format!("bpftime_builtin_{}", what.to_lowercase())
    }
}

/// How one helper is lowered on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuHelper {
    /// Computed inside the module.
    Builtin(Builtin),
    /// A call to a device function of this name with the helper ABI, which the GPU
    /// runtime links (or the [`GpuEnv::library`] defines).
    Extern(String),
}

/// The helpers that run as device functions of the GPU runtime, with the names it must
/// define: `u64 name(u64 r1, u64 r2, u64 r3, u64 r4, u64 r5)`, r0 returned. Read from
/// the registry ([`bpftime_isa::helpers`]), where each GPU helper says how it runs.
pub fn extern_helpers() -> Vec<(u32, &'static str)> {
    helpers::on(Engine::Gpu)
        .filter_map(|d| match d.gpu {
            GpuImpl::Extern(name) => Some((d.id, name)),
            _ => None,
        })
        .collect()
}

/// The builtin that computes helper `id` (one the registry marks
/// [`GpuImpl::Builtin`]).
fn builtin(id: u32) -> Option<Builtin> {
    use Builtin::{Dim3, HostClockNs, Membar, Read};
    use SpecialRegister::{GlobalTimerNs, LaneId, SmId, WarpId};
    Some(match id {
        h::KTIME_GET_NS => HostClockNs,
        h::GPU_GLOBALTIMER => Read(GlobalTimerNs),
        h::GET_SMP_PROCESSOR_ID | h::GPU_SM_ID => Read(SmId),
        h::GPU_WARP_ID => Read(WarpId),
        h::GPU_LANE_ID => Read(LaneId),
        h::GPU_BLOCK_IDX => Dim3(Dimension::BlockIdx),
        h::GPU_BLOCK_DIM => Dim3(Dimension::BlockDim),
        h::GPU_THREAD_IDX => Dim3(Dimension::ThreadIdx),
        h::GPU_GRID_DIM => Dim3(Dimension::GridDim),
        h::GPU_MEMBAR => Membar,
        _ => return None,
    })
}

/// The standard GPU lowering of helper `id`: the helpers the registry marks for the
/// GPU (which the verifier allows in GPU programs), and nothing else.
pub fn standard_helper(id: u32) -> Option<GpuHelper> {
    match helpers::lookup(id)?.gpu {
        GpuImpl::None => None,
        GpuImpl::Builtin => builtin(id).map(GpuHelper::Builtin),
        GpuImpl::Extern(name) => Some(GpuHelper::Extern(name.to_string())),
    }
}

/// What the runtime supplies when it compiles a program for a GPU.
pub trait GpuEnv {
    /// How to lower helper `id`; `None` refuses the program.
    fn helper(&self, id: u32) -> Option<GpuHelper> {
        standard_helper(id)
    }

    /// The layout of the array map at `map` (the value an `lddw` loads), in device
    /// memory, to inline its lookups.
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        let _ = map;
        None
    }

    /// Every array map [`GpuEnv::array_map`] answers for: where their values lie bounds
    /// the addresses made from them ([`fold_known_in_range`]).
    fn array_maps(&self) -> Vec<ArrayMapLayout> {
        Vec::new()
    }

    /// LLVM IR, as text, linked into the module before optimization: definitions of
    /// [`GpuHelper::Extern`] functions that should live inside the program rather than
    /// in the runtime. Its definitions become internal to the program.
    fn library(&self) -> Option<&str> {
        None
    }

    /// LLVM bitcode for the same purpose, which parses in less time than text; linked
    /// with [`GpuEnv::library`] when both are given (the text may define what the
    /// bitcode only declares).
    fn library_bitcode(&self) -> Option<&[u8]> {
        None
    }
}

/// The standard helpers, no inlined maps, no library.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandardGpuEnv;

impl GpuEnv for StandardGpuEnv {}

/// How hard LLVM works on GPU code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OptLevel {
    O0,
    O1,
    /// The default: a GPU program is compiled once per module load, and the driver's
    /// own compilation of the result costs more than LLVM's.
    #[default]
    O2,
    O3,
}

impl OptLevel {
    pub fn pipeline(self) -> &'static str {
        match self {
            OptLevel::O0 => "default<O0>",
            OptLevel::O1 => "default<O1>",
            OptLevel::O2 => "default<O2>",
            OptLevel::O3 => "default<O3>",
        }
    }

    pub fn codegen(self) -> inkwell::OptimizationLevel {
        match self {
            OptLevel::O0 => inkwell::OptimizationLevel::None,
            OptLevel::O1 => inkwell::OptimizationLevel::Less,
            OptLevel::O2 => inkwell::OptimizationLevel::Default,
            OptLevel::O3 => inkwell::OptimizationLevel::Aggressive,
        }
    }
}

/// What each GPU backend supplies to [`build_module`].
pub trait GpuBackend {
    /// Sets the module's triple and data layout.
    fn prepare(&self, module: &Module<'_>);

    /// Emits a read of `reg` at the builder's position, as an `i64`.
    fn read_register<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
        reg: SpecialRegister,
    ) -> Result<IntValue<'ctx>, CompileError>;

    /// Emits a system-scope memory barrier.
    fn membar<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
    ) -> Result<(), CompileError>;

    /// Makes `kernel` a kernel entry point (launchable from the host).
    fn mark_kernel<'ctx>(
        &self,
        module: &Module<'ctx>,
        kernel: FunctionValue<'ctx>,
    ) -> Result<(), CompileError>;

    /// Last changes to the finished module before verification.
    fn finish(&self, module: &Module<'_>) -> Result<(), CompileError> {
        let _ = module;
        Ok(())
    }
}

/// How an instrumented kernel hands a probe its context.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum ProbeAbi {
    /// `u64 probe(void *ctx)`: a pointer to a context the caller built.
    #[default]
    Context,
    /// `u64 probe(u64 a0, ..)`: the probe builds a zeroed context of `size` bytes on its
    /// own stack with argument `i` at `offsets[i]` (the kprobe `pt_regs` slots of the
    /// kernel's parameters). Reads the program makes at constant offsets then become the
    /// arguments themselves, and a context it never reads costs nothing: a context built
    /// by the caller in local memory costs every thread its size in stores.
    ///
    /// Bit `i` of `uniform` says argument `i` is the same in every lane of a warp that
    /// makes one call (a kernel parameter, a constant of the call site): warp-wide
    /// operations on values made only from such arguments and constants fold away
    /// ([`fold_uniform_warp_ops`]), as they would for constants.
    Arguments {
        size: u32,
        offsets: Vec<u32>,
        uniform: u64,
    },
}

/// A lifted GPU module before optimization and code generation.
#[derive(Debug)]
pub struct GpuModule<'ctx> {
    pub module: Module<'ctx>,
    /// Name of the probe function, `u64 func(void *ctx)`.
    pub func: String,
    /// Name of the kernel, `kernel(void *mem, u64 len, u64 *result)`, when one was asked for.
    pub kernel: Option<String>,
    /// The global `i64` that `ktime_get_ns` adds to the global timer, when the program
    /// calls it: the runtime writes (host `CLOCK_MONOTONIC` − global timer), in
    /// nanoseconds, after loading the module and before launching.
    pub clock_offset: Option<String>,
}

/// The [`LoweringTarget`] of GPU programs: every helper is a call by name; builtins are
/// defined after lifting.
struct GpuLowering<'a> {
    env: &'a dyn GpuEnv,
    /// Functions the library defines, which `callx` may reach.
    defined: &'a BTreeSet<String>,
    entry: String,
    builtins: RefCell<BTreeMap<String, Builtin>>,
}

impl LoweringTarget for GpuLowering<'_> {
    fn helper(&self, id: u32) -> Option<HelperLowering> {
        Some(match self.env.helper(id)? {
            GpuHelper::Builtin(b) => {
                let name = b.symbol();
                self.builtins.borrow_mut().insert(name.clone(), b);
                HelperLowering::Symbol(name)
            }
            GpuHelper::Extern(name) => HelperLowering::Symbol(name),
        })
    }

    /// Only helpers whose code is in the module: a `callx` (a uBPF extension that GPU
    /// programs from libbpf never use) must not pull every runtime helper into a
    /// program that would otherwise link on its own.
    fn callx_helpers(&self) -> Vec<u32> {
        (0..256)
            .filter(|&id| match self.env.helper(id) {
                Some(GpuHelper::Builtin(_)) => true,
                Some(GpuHelper::Extern(name)) => self.defined.contains(&name),
                None => false,
            })
            .collect()
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.env.array_map(map)
    }

    fn split_misaligned_access(&self) -> bool {
        true
    }

    fn entry_name(&self) -> &str {
        &self.entry
    }
}

/// Whether `s` can name a PTX and ELF symbol: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Looks up a (non-overloaded unless `overloads` says so) intrinsic.
pub fn intrinsic<'ctx>(
    module: &Module<'ctx>,
    name: &str,
    overloads: &[BasicTypeEnum<'ctx>],
) -> Result<FunctionValue<'ctx>, CompileError> {
    Intrinsic::find(name)
        .and_then(|i| i.get_declaration(module, overloads))
        .ok_or_else(|| CompileError::Intrinsic {
            name: name.to_string(),
        })
}

/// Calls `f` with `args` and returns its integer result.
pub fn call_int<'ctx>(
    builder: &Builder<'ctx>,
    f: FunctionValue<'ctx>,
    args: &[inkwell::values::BasicMetadataValueEnum<'ctx>],
    name: &str,
) -> Result<IntValue<'ctx>, CompileError> {
    builder
        .build_call(f, args, name)?
        .try_as_basic_value()
        .basic()
        .map(|v| v.into_int_value())
        .ok_or_else(|| CompileError::InvalidIr {
            message: format!("{} returns nothing", f.get_name().to_string_lossy()),
        })
}

/// The environment's library as one module: its bitcode with its text IR linked in.
fn library_module<'ctx>(
    context: &'ctx Context,
    env: &dyn GpuEnv,
) -> Result<Option<Module<'ctx>>, CompileError> {
    let failed = |e: &dyn std::fmt::Display| CompileError::Library {
        message: e.to_string(),
    };
    let bitcode = env
        .library_bitcode()
        .map(|bc| {
            let buffer = MemoryBuffer::create_from_memory_range_copy(bc, "library");
            Module::parse_bitcode_from_buffer(&buffer, context).map_err(|e| failed(&e))
        })
        .transpose()?;
    let text = env
        .library()
        .map(|ir| {
            let buffer = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "library");
            context
                .create_module_from_ir(buffer)
                .map_err(|e| failed(&e))
        })
        .transpose()?;
    match (bitcode, text) {
        (Some(bitcode), Some(text)) => {
            bitcode.link_in_module(text).map_err(|e| failed(&e))?;
            Ok(Some(bitcode))
        }
        (bitcode, text) => Ok(bitcode.or(text)),
    }
}

/// Makes every definition of `library` internal but those the lifted `module` calls (and
/// the warp adds `route_atomic_adds` may call once linked), so that linking copies only
/// what those reach: the rest of the library is never linked, verified or optimized
/// (a fifth of a small probe's compile time).
fn keep_only_what_is_called(module: &Module<'_>, library: &Module<'_>, defined: &BTreeSet<String>) {
    let called: BTreeSet<String> = module
        .get_functions()
        .filter(|f| f.count_basic_blocks() == 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .filter(|name| defined.contains(name))
        .chain([WARP_ADD_U64.to_string(), WARP_ADD_U32.to_string()])
        .collect();
    for f in library.get_functions() {
        if f.count_basic_blocks() > 0 && !called.contains(f.get_name().to_string_lossy().as_ref()) {
            f.set_linkage(Linkage::Internal);
        }
    }
}

fn nounwind(context: &Context) -> Attribute {
    context.create_enum_attribute(Attribute::get_named_enum_kind_id("nounwind"), 0)
}

/// Lifts `insns` into a module for `backend`: builtins defined, the library linked, the
/// probe function `symbol` and, `with_kernel`, the kernel `<symbol>_kernel` added,
/// everything else internal and prefixed with `symbol`.
pub fn build_module<'ctx>(
    context: &'ctx Context,
    insns: &[Insn],
    env: &dyn GpuEnv,
    backend: &dyn GpuBackend,
    symbol: &str,
    with_kernel: bool,
    abi: &ProbeAbi,
) -> Result<GpuModule<'ctx>, CompileError> {
    if !is_valid_symbol(symbol) {
        return Err(CompileError::InvalidOption {
            message: format!(
                "`{symbol}` cannot name a GPU symbol: use letters, digits and `_`, not starting \
                 with a digit"
            ),
        });
    }
    let library = library_module(context, env)?;
    let defined: BTreeSet<String> = library
        .iter()
        .flat_map(|m| m.get_functions())
        .filter(|f| f.count_basic_blocks() > 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .collect();

    let lowering = GpuLowering {
        env,
        defined: &defined,
        entry: format!("{symbol}__body"),
        builtins: RefCell::new(BTreeMap::new()),
    };
    let lifted = lift(context, insns, &lowering)?;
    let module = lifted.module;
    let body = lifted.entry;
    backend.prepare(&module);
    if let Some(library) = library {
        backend.prepare(&library);
        keep_only_what_is_called(&module, &library, &defined);
        module
            .link_in_module(library)
            .map_err(|e| CompileError::Library {
                message: e.to_string(),
            })?;
    }

    let builder = context.create_builder();
    let clock_offset = format!("{symbol}__clock_offset_ns");
    let mut reads_clock_offset = false;
    for (name, builtin) in lowering.builtins.borrow().iter() {
        if let Some(f) = module.get_function(name) {
            reads_clock_offset |= *builtin == Builtin::HostClockNs;
            define_builtin(
                context,
                &module,
                &builder,
                backend,
                f,
                *builtin,
                &clock_offset,
            )?;
        }
    }
    // Before the library's functions are renamed into the program's namespace.
    route_atomic_adds(&module)?;
    let always_inline =
        context.create_enum_attribute(Attribute::get_named_enum_kind_id("alwaysinline"), 0);
    for f in module.get_functions() {
        let name = f.get_name().to_string_lossy().into_owned();
        if f.count_basic_blocks() == 0 {
            continue;
        }
        if defined.contains(&name) || lowering.builtins.borrow().contains_key(&name) {
            f.set_linkage(Linkage::Internal);
        }
        if lowering.builtins.borrow().contains_key(&name) {
            f.add_attribute(AttributeLoc::Function, always_inline);
        }
        if f.get_linkage() != Linkage::External && !name.starts_with(&format!("{symbol}__")) {
            f.as_global_value().set_name(&format!("{symbol}__{name}"));
        }
    }
    body.set_linkage(Linkage::Internal);

    let i64t = context.i64_type();
    let ptr = context.ptr_type(AddressSpace::default());
    let zero = i64t.const_zero();

    // The probe function: r1 = ctx.
    let params: Vec<_> = match abi {
        ProbeAbi::Context => vec![ptr.into()],
        ProbeAbi::Arguments { size, offsets, .. } => {
            if offsets.iter().any(|&o| o % 8 != 0 || o + 8 > *size) {
                return Err(CompileError::InvalidOption {
                    message: format!(
                        "probe argument offsets {offsets:?} must be 8-byte slots inside {size} bytes"
                    ),
                });
            }
            offsets.iter().map(|_| i64t.into()).collect()
        }
    };
    let func = module.add_function(
        symbol,
        i64t.fn_type(&params, false),
        Some(Linkage::External),
    );
    func.add_attribute(AttributeLoc::Function, nounwind(context));
    builder.position_at_end(context.append_basic_block(func, "entry"));
    let ctx = match abi {
        ProbeAbi::Context => param_ptr(func, 0)?,
        ProbeAbi::Arguments { size, offsets, .. } => {
            let slots = i64t.array_type(size.div_ceil(8));
            let ctx = builder.build_alloca(slots, "ctx")?;
            builder.build_store(ctx, slots.const_zero())?;
            for (i, &offset) in offsets.iter().enumerate() {
                let arg = func
                    .get_nth_param(i as u32)
                    .ok_or_else(|| CompileError::InvalidIr {
                        message: format!("probe argument {i} is missing"),
                    })?;
                // SAFETY: (for LLVM) the offset is inside the alloca, checked above.
                let at = unsafe {
                    builder.build_in_bounds_gep(
                        slots,
                        ctx,
                        &[i64t.const_zero(), i64t.const_int(offset as u64 / 8, false)],
                        "slot",
                    )?
                };
                builder.build_store(at, arg)?;
            }
            ctx
        }
    };
    let ctx = builder.build_ptr_to_int(ctx, i64t, "ctx")?;
    let r0 = call_int(
        &builder,
        body,
        &[ctx.into(), zero.into(), zero.into()],
        "r0",
    )?;
    builder.build_return(Some(&r0))?;

    let kernel_name = if with_kernel {
        Some(add_kernel(
            context, &module, &builder, backend, body, symbol,
        )?)
    } else {
        None
    };

    backend.finish(&module)?;
    module.verify().map_err(|e| CompileError::InvalidIr {
        message: e.to_string(),
    })?;
    Ok(GpuModule {
        module,
        func: symbol.to_string(),
        kernel: kernel_name,
        clock_offset: reads_clock_offset.then_some(clock_offset),
    })
}

/// Adds `<symbol>_kernel(mem, len, result)`, which runs `body` with r1 = mem, r2 = len
/// and stores r0 to `*result`.
fn add_kernel<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    builder: &Builder<'ctx>,
    backend: &dyn GpuBackend,
    body: FunctionValue<'ctx>,
    symbol: &str,
) -> Result<String, CompileError> {
    let i64t = context.i64_type();
    let ptr = context.ptr_type(AddressSpace::default());
    let zero = i64t.const_zero();
    let kernel_name = format!("{symbol}_kernel");
    let kernel = module.add_function(
        &kernel_name,
        context
            .void_type()
            .fn_type(&[ptr.into(), i64t.into(), ptr.into()], false),
        Some(Linkage::External),
    );
    kernel.add_attribute(AttributeLoc::Function, nounwind(context));
    builder.position_at_end(context.append_basic_block(kernel, "entry"));
    let mem = builder.build_ptr_to_int(param_ptr(kernel, 0)?, i64t, "mem")?;
    let len = kernel
        .get_nth_param(1)
        .map(|p| p.into_int_value())
        .ok_or_else(|| CompileError::InvalidIr {
            message: "kernel lost its length parameter".into(),
        })?;
    let r0 = call_int(builder, body, &[mem.into(), len.into(), zero.into()], "r0")?;
    builder.build_store(param_ptr(kernel, 2)?, r0)?;
    builder.build_return(None)?;
    backend.mark_kernel(module, kernel)?;
    Ok(kernel_name)
}

fn param_ptr<'ctx>(
    f: FunctionValue<'ctx>,
    index: u32,
) -> Result<inkwell::values::PointerValue<'ctx>, CompileError> {
    f.get_nth_param(index)
        .map(|p| p.into_pointer_value())
        .ok_or_else(|| CompileError::InvalidIr {
            message: format!("parameter {index} is missing"),
        })
}

fn define_builtin<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    builder: &Builder<'ctx>,
    backend: &dyn GpuBackend,
    f: FunctionValue<'ctx>,
    builtin: Builtin,
    clock_offset: &str,
) -> Result<(), CompileError> {
    builder.position_at_end(context.append_basic_block(f, "entry"));
    let i64t = context.i64_type();
    let r0 = match builtin {
        Builtin::Read(reg) => backend.read_register(module, builder, reg)?,
        Builtin::Dim3(dim) => {
            let ptr = context.ptr_type(AddressSpace::default());
            for (i, axis) in Axis::ALL.into_iter().enumerate() {
                let v = backend.read_register(module, builder, SpecialRegister::Dim(dim, axis))?;
                let out = f
                    .get_nth_param(i as u32)
                    .ok_or_else(|| CompileError::InvalidIr {
                        message: "helper lost a parameter".into(),
                    })?
                    .into_int_value();
                let out = builder.build_int_to_ptr(out, ptr, "out")?;
                let store = builder.build_store(out, v)?;
                // The verifier proves 8 writable bytes, not their alignment.
                let _ = store.set_alignment(1);
            }
            i64t.const_zero()
        }
        Builtin::Membar => {
            backend.membar(module, builder)?;
            i64t.const_zero()
        }
        Builtin::HostClockNs => {
            let offset = module.get_global(clock_offset).unwrap_or_else(|| {
                let g = module.add_global(i64t, Some(global_address_space()), clock_offset);
                g.set_initializer(&i64t.const_zero());
                g.set_linkage(Linkage::External);
                g.set_alignment(8);
                g
            });
            let timer = backend.read_register(module, builder, SpecialRegister::GlobalTimerNs)?;
            let offset = builder
                .build_load(i64t, offset.as_pointer_value(), "clock_offset")?
                .into_int_value();
            builder.build_int_add(timer, offset, "host_ns")?
        }
    };
    builder.build_return(Some(&r0))?;
    Ok(())
}

/// Device global memory, on NVPTX and AMDGPU alike.
fn global_address_space() -> AddressSpace {
    AddressSpace::from(1u16)
}

/// Functions the module calls but does not define (the runtime's device functions),
/// LLVM intrinsics left out.
pub fn extern_functions(module: &Module<'_>) -> Vec<String> {
    module
        .get_functions()
        .filter(|f| f.count_basic_blocks() == 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("llvm."))
        .collect()
}

/// Where an address can come from, as the IR shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// An `alloca`: the eBPF stack.
    Stack,
    /// A non-null constant: a relocated map's values (eBPF cannot make up pointers).
    Map,
}

/// Whether `v` is an address inside an `alloca` (the eBPF stack): derived from one
/// through pointer casts, GEPs and integer arithmetic, or a phi/select whose every
/// input is. Loads are not looked through: a loaded value is data.
fn is_stack_address(v: inkwell::values::BasicValueEnum<'_>, depth: u32) -> bool {
    derives_from(v, Origin::Stack, depth)
}

/// Whether `v` is an address made from a constant one (a relocated map's values, or a
/// value in them picked by a computed index): a non-null constant, or derived from one
/// through pointer casts, GEPs and integer arithmetic with values that are not stack
/// addresses, or a phi/select whose every input is. Such an address is in device
/// memory, never in a thread's stack.
fn is_map_address(v: inkwell::values::BasicValueEnum<'_>, depth: u32) -> bool {
    derives_from(v, Origin::Map, depth)
}

fn derives_from(v: inkwell::values::BasicValueEnum<'_>, origin: Origin, depth: u32) -> bool {
    use inkwell::values::{BasicValue, BasicValueEnum as V, InstructionOpcode as Op};
    let constant = match v {
        V::IntValue(i) => i
            .is_const()
            .then(|| i.get_zero_extended_constant() != Some(0)),
        V::PointerValue(p) => p.is_const().then(|| !p.is_null()),
        _ => None,
    };
    if let Some(non_null) = constant {
        return origin == Origin::Map && non_null;
    }
    let Some(i) = v.as_instruction_value() else {
        return false;
    };
    if depth > 32 {
        return false;
    }
    let operands = || {
        i.get_operands().filter_map(|o| match o {
            Some(inkwell::values::Operand::Value(v)) => Some(v),
            _ => None,
        })
    };
    let from = |o| derives_from(o, origin, depth + 1);
    // What a map address is combined with must not be a stack address.
    let no_stack = |skip: usize| {
        origin == Origin::Stack
            || operands()
                .skip(skip)
                .all(|o| !is_stack_address(o, depth + 1))
    };
    match i.get_opcode() {
        Op::Alloca => origin == Origin::Stack,
        Op::GetElementPtr => operands().next().is_some_and(from) && no_stack(1),
        Op::BitCast | Op::AddrSpaceCast | Op::IntToPtr | Op::PtrToInt => {
            operands().next().is_some_and(from)
        }
        Op::Add | Op::Or => operands().any(from) && no_stack(0),
        Op::Sub if origin == Origin::Stack => operands().any(from),
        Op::Sub => operands().next().is_some_and(from) && no_stack(1),
        Op::Phi => {
            let mut incoming = operands().peekable();
            incoming.peek().is_some() && incoming.all(from)
        }
        Op::Select => {
            let mut arms = operands().skip(1).peekable();
            arms.peek().is_some() && arms.all(from)
        }
        _ => false,
    }
}

/// The bytes `[start, end)` of each array map's values that `arrays` lays out (per-CPU
/// ones left out: their copies lie elsewhere).
pub fn array_extents(arrays: &[ArrayMapLayout]) -> Vec<(u64, u64)> {
    arrays
        .iter()
        .filter(|a| a.per_cpu.is_none())
        .filter_map(|a| {
            let len = u64::from(a.key_stride).checked_mul(u64::from(a.max_entries))?;
            Some((a.values, a.values.checked_add(len)?))
        })
        .collect()
}

/// The device runtime's question "is this address, which a program's atomic add is about
/// to reach, in `[LO, LO + LEN)`?", `i1 KNOWN_IN_RANGE(i64 addr, i64 LO, i64 LEN)`, which
/// [`fold_known_in_range`] answers at compile time: 1 when it can prove so, else 0 (the
/// runtime then tests the address itself).
pub const KNOWN_IN_RANGE: &str = "bpftime_gpu_known_in_range";

/// Answers every [`KNOWN_IN_RANGE`] question: yes when every address `addr` can be is in
/// an array map's values (`extents`) and those lie within the range. `addr` is such an
/// address when it is made from a constant inside one of `extents` (an inlined lookup's
/// value, a global's) by adding offsets, through casts, phis and selects: the runtime
/// asks only of addresses a program's atomic reaches, which the verifier let it reach
/// only inside that map's values. The device runtime's test for a sharded array (is this
/// add's address in the context's shard window?) asks it, as LLVM cannot prove it when
/// the histogram is one of several picked at run time. Returns how many it answered.
pub fn fold_known_in_range(
    module: &Module<'_>,
    extents: &[(u64, u64)],
) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op};
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        if callee_name(call).as_deref() != Some(KNOWN_IN_RANGE) {
            continue;
        }
        let (Some((addr, lo)), Some(len)) = (first_two_operands(call), value_operand(call, 2))
        else {
            continue;
        };
        let proved = match (constant_u64(lo), constant_u64(len)) {
            (Some(lo), Some(len)) => address_extent(addr, extents, 0)
                .is_some_and(|(s, e)| s >= lo && e.checked_sub(lo).is_some_and(|n| n <= len)),
            _ => false,
        };
        let this = call.as_any_value_enum();
        if !this.is_int_value() {
            continue;
        }
        let int = this.into_int_value();
        int.replace_all_uses_with(int.get_type().const_int(u64::from(proved), false));
        call.erase_from_basic_block();
        folded += 1;
    }
    drop_unused_declaration(module, KNOWN_IN_RANGE);
    Ok(folded)
}

/// An instruction's first two operands, when both are values.
fn first_two_operands(
    i: inkwell::values::InstructionValue<'_>,
) -> Option<(
    inkwell::values::BasicValueEnum<'_>,
    inkwell::values::BasicValueEnum<'_>,
)> {
    Some((value_operand(i, 0)?, value_operand(i, 1)?))
}

/// Operand `n` of `i`, when it is a value (not a block).
fn value_operand(
    i: inkwell::values::InstructionValue<'_>,
    n: u32,
) -> Option<inkwell::values::BasicValueEnum<'_>> {
    match i.get_operand(n) {
        Some(inkwell::values::Operand::Value(v)) => Some(v),
        _ => None,
    }
}

/// The name of the function `call` calls (its last operand).
fn callee_name(call: inkwell::values::InstructionValue<'_>) -> Option<String> {
    let callee = value_operand(call, call.get_num_operands().checked_sub(1)?)?;
    Some(callee.get_name().to_string_lossy().into_owned())
}

/// Deletes the declaration of `name` once nothing calls it: a question of the device
/// runtime's that a fold has answered everywhere, which would otherwise read as a helper
/// the runtime lacks.
fn drop_unused_declaration(module: &Module<'_>, name: &str) {
    use inkwell::values::BasicValue;
    if let Some(f) = module.get_function(name) {
        if f.as_global_value()
            .as_pointer_value()
            .get_first_use()
            .is_none()
        {
            // SAFETY: a declaration nothing refers to any more.
            unsafe { f.delete() };
        }
    }
}

fn constant_u64(v: inkwell::values::BasicValueEnum<'_>) -> Option<u64> {
    v.is_int_value()
        .then(|| v.into_int_value())
        .filter(|i| i.is_const())
        .and_then(|i| i.get_zero_extended_constant())
}

/// The hull of the extents `v` can point into, made as [`fold_known_in_range`] says;
/// `None` when it is not made so.
fn address_extent(
    v: inkwell::values::BasicValueEnum<'_>,
    extents: &[(u64, u64)],
    depth: u32,
) -> Option<(u64, u64)> {
    use inkwell::values::{BasicValue, InstructionOpcode as Op, Operand};
    if let Some(c) = constant_u64(v) {
        return extents.iter().copied().find(|&(s, e)| s <= c && c < e);
    }
    let i = v.as_instruction_value()?;
    if depth > 32 {
        return None;
    }
    let operands: Vec<_> = i
        .get_operands()
        .map(|o| match o {
            Some(Operand::Value(v)) => Some(v),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let hull = |a: (u64, u64), b: (u64, u64)| (a.0.min(b.0), a.1.max(b.1));
    match i.get_opcode() {
        Op::BitCast | Op::AddrSpaceCast | Op::IntToPtr | Op::PtrToInt => {
            address_extent(*operands.first()?, extents, depth + 1)
        }
        // An offset added to a map address: exactly one side is the address (LLVM writes
        // a disjoint add as `or`).
        Op::Add | Op::Or => {
            let mut sides = operands
                .iter()
                .map(|&o| address_extent(o, extents, depth + 1));
            match (sides.next()?, sides.next()?) {
                (Some(e), None) | (None, Some(e)) => Some(e),
                _ => None,
            }
        }
        Op::GetElementPtr => {
            let e = address_extent(*operands.first()?, extents, depth + 1)?;
            operands[1..]
                .iter()
                .all(|&o| address_extent(o, extents, depth + 1).is_none())
                .then_some(e)
        }
        Op::Sub => {
            let e = address_extent(*operands.first()?, extents, depth + 1)?;
            (address_extent(*operands.get(1)?, extents, depth + 1).is_none()).then_some(e)
        }
        Op::Phi => operands
            .iter()
            .map(|&o| address_extent(o, extents, depth + 1))
            .reduce(|a, b| Some(hull(a?, b?)))?,
        Op::Select => operands[1..]
            .iter()
            .map(|&o| address_extent(o, extents, depth + 1))
            .reduce(|a, b| Some(hull(a?, b?)))?,
        _ => None,
    }
}

/// Turns clang's BPF expansion of a count of leading zeros back into one: eBPF has no
/// such instruction, so `__builtin_clz` (and the loop LLVM recognizes as one, such as a
/// log2's `while (v >>= 1) r++`) reaches us as the bits below the highest set one smeared
/// down (`x |= x >> 1`, `>> 2`, .. `>> N/2`) and a population count of the complement,
/// about 15 GPU instructions where `clz` is one. Returns how many it turned back.
pub fn fold_smeared_ctlz(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op, Operand};
    let builder = module.get_context().create_builder();
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        if !callee_name(call).is_some_and(|n| n.starts_with("llvm.ctpop.i")) {
            continue;
        }
        let Some(Operand::Value(arg)) = call.get_operand(0) else {
            continue;
        };
        let Some(x) = unsmeared_complement(arg) else {
            continue;
        };
        let int = x.into_int_value();
        let ctlz = intrinsic(module, "llvm.ctlz", &[int.get_type().into()])?;
        builder.position_before(&call);
        let zeros = call_int(
            &builder,
            ctlz,
            &[
                int.into(),
                module.get_context().bool_type().const_zero().into(),
            ],
            "clz",
        )?;
        call.as_any_value_enum()
            .into_int_value()
            .replace_all_uses_with(zeros);
        call.erase_from_basic_block();
        folded += 1;
    }
    Ok(folded)
}

/// Rewrites `select (v <u 2), C, g(ctlz(v))` as `g(ctlz(v | 1))` where `g(ctlz(1))` is
/// `C`, and returns how many it rewrote. A log2 written as `while (v >>= 1) r++` (which
/// LLVM turns into a count of leading zeros) is 0 for 0 and 1, so its count comes guarded
/// by a compare; but `v | 1` has the same leading zeros as `v` for every `v` above 1, and
/// those of 1 for 0 and 1, so the guard's answer is the count's own where `g` maps
/// `ctlz(1)` to it. On a GPU the compare and the select of a 64-bit value are four
/// instructions, the `or` one. `g` is a chain of single-use integer operations with a
/// constant operand each (memtrace's slot address: `(clz << 3) ^ 504`), evaluated at
/// `ctlz(1)` by constant folding.
pub fn fold_guarded_ctlz(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, AsValueRef, BasicValue, InstructionOpcode as Op};
    use inkwell::IntPredicate;
    let builder = module.get_context().create_builder();
    let mut folded = 0;
    for select in instructions_where(module, |i| i.get_opcode() == Op::Select) {
        let (Some(cond), Some(yes), Some(no)) = (
            value_operand(select, 0),
            value_operand(select, 1),
            value_operand(select, 2),
        ) else {
            continue;
        };
        let Some(icmp) = cond
            .as_instruction_value()
            .filter(|i| i.get_opcode() == Op::ICmp)
        else {
            continue;
        };
        let (Some(v), Some(bound)) = (
            value_operand(icmp, 0),
            value_operand(icmp, 1).and_then(constant_u64),
        ) else {
            continue;
        };
        // (the guard's answer, the guarded count's chain)
        let (guarded, chain) = match (icmp.get_icmp_predicate(), bound) {
            (Some(IntPredicate::ULT), 2) | (Some(IntPredicate::ULE), 1) => (yes, no),
            (Some(IntPredicate::UGT), 1) | (Some(IntPredicate::UGE), 2) => (no, yes),
            _ => continue,
        };
        let Some(answer) = constant_u64(guarded) else {
            continue;
        };
        // Down the chain to the count, each link used once (by the next).
        let mut links = Vec::new();
        let mut at = chain;
        let ctlz = loop {
            let Some(i) = at.as_instruction_value() else {
                break None;
            };
            if i.get_first_use().is_none_or(|u| u.get_next_use().is_some()) {
                break None;
            }
            if i.get_opcode() == Op::Call {
                let is_ctlz = callee_name(i).is_some_and(|n| n.starts_with("llvm.ctlz.i"));
                let of_v =
                    value_operand(i, 0).is_some_and(|x| x.as_value_ref() == v.as_value_ref());
                break (is_ctlz && of_v).then_some(i);
            }
            let next = match i.get_opcode() {
                Op::ZExt | Op::Trunc => value_operand(i, 0),
                Op::Shl | Op::LShr | Op::Xor | Op::Or | Op::And | Op::Add | Op::Sub => {
                    match (value_operand(i, 0), value_operand(i, 1)) {
                        (Some(a), Some(b)) if constant_u64(b).is_some() => Some(a),
                        (Some(a), Some(b)) if constant_u64(a).is_some() => Some(b),
                        _ => None,
                    }
                }
                _ => None,
            };
            let Some(next) = next else { break None };
            links.push(i);
            at = next;
        };
        let Some(ctlz) = ctlz else { continue };
        // g(ctlz(1)): the chain again, on the constant.
        let ty = ctlz.get_type().into_int_type();
        let mut value = ty.const_int(u64::from(ty.get_bit_width()) - 1, false);
        builder.position_before(&select);
        let mut evaluated = true;
        for link in links.iter().rev() {
            let other = |n| value_operand(*link, n).map(|o| o.into_int_value());
            let on_left = value_operand(*link, 0).and_then(constant_u64).is_none();
            let (lhs, rhs) = match (on_left, other(0), other(1)) {
                (true, _, Some(k)) => (value, k),
                (false, Some(k), _) => (k, value),
                _ => (value, value),
            };
            let result = match link.get_opcode() {
                Op::ZExt => builder.build_int_z_extend(value, link.get_type().into_int_type(), ""),
                Op::Trunc => builder.build_int_truncate(value, link.get_type().into_int_type(), ""),
                Op::Shl => builder.build_left_shift(lhs, rhs, ""),
                Op::LShr => builder.build_right_shift(lhs, rhs, false, ""),
                Op::Xor => builder.build_xor(lhs, rhs, ""),
                Op::Or => builder.build_or(lhs, rhs, ""),
                Op::And => builder.build_and(lhs, rhs, ""),
                Op::Add => builder.build_int_add(lhs, rhs, ""),
                Op::Sub => builder.build_int_sub(lhs, rhs, ""),
                _ => unreachable!("only these links are followed"),
            }?;
            if !result.is_const() {
                evaluated = false;
                break;
            }
            value = result;
        }
        if !evaluated || value.get_zero_extended_constant() != Some(answer) {
            continue;
        }
        builder.position_before(&ctlz);
        let v = v.into_int_value();
        let or = builder.build_or(v, v.get_type().const_int(1, false), "nonzero")?;
        if !ctlz.set_operand(0, or) {
            continue;
        }
        select
            .as_any_value_enum()
            .into_int_value()
            .replace_all_uses_with(chain.into_int_value());
        select.erase_from_basic_block();
        folded += 1;
    }
    Ok(folded)
}

/// `x` when `v` is `~smear(x)`: `smear` the ors of shifts right by N/2, .., 2, 1 (outermost
/// first) of an N-bit integer (32 or 64).
fn unsmeared_complement<'ctx>(
    v: inkwell::values::BasicValueEnum<'ctx>,
) -> Option<inkwell::values::BasicValueEnum<'ctx>> {
    use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum, InstructionOpcode as Op};
    let value = value_operand;
    let same =
        |a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>| a.as_value_ref() == b.as_value_ref();
    let not = v.as_instruction_value()?;
    if not.get_opcode() != Op::Xor {
        return None;
    }
    let (a, b) = (value(not, 0)?, value(not, 1)?);
    let mut smeared = match (constant_u64(b), constant_u64(a)) {
        (Some(_), _) if b.into_int_value().get_sign_extended_constant() == Some(-1) => a,
        (_, Some(_)) if a.into_int_value().get_sign_extended_constant() == Some(-1) => b,
        _ => return None,
    };
    let bits = smeared.into_int_value().get_type().get_bit_width();
    if bits != 32 && bits != 64 {
        return None;
    }
    let mut shift = bits / 2;
    while shift >= 1 {
        let or = smeared.as_instruction_value()?;
        if or.get_opcode() != Op::Or {
            return None;
        }
        let (p, q) = (value(or, 0)?, value(or, 1)?);
        // One side is `inner >> shift`, the other `inner`.
        let shifted_of = |s: BasicValueEnum<'ctx>| {
            let i = s.as_instruction_value()?;
            (i.get_opcode() == Op::LShr && constant_u64(value(i, 1)?) == Some(u64::from(shift)))
                .then(|| value(i, 0))?
        };
        smeared = match (shifted_of(p), shifted_of(q)) {
            (Some(inner), _) if same(inner, q) => q,
            (_, Some(inner)) if same(inner, p) => p,
            _ => return None,
        };
        shift /= 2;
    }
    Some(smeared)
}

/// Whether every lane of a warp holds `v` alike: a constant, one of `uniform` (values by
/// their LLVM references), or pure arithmetic, casts, compares and selects of such
/// values. A phi is not: lanes that reach it by different edges hold different inputs.
/// Nor is a load, or a call's result.
fn is_warp_uniform(v: inkwell::values::BasicValueEnum<'_>, uniform: &[usize], depth: u32) -> bool {
    use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum as V, InstructionOpcode as Op};
    let constant = match v {
        V::IntValue(i) => i.is_const(),
        V::PointerValue(p) => p.is_const(),
        _ => false,
    };
    if constant || uniform.contains(&(v.as_value_ref() as usize)) {
        return true;
    }
    let Some(i) = v.as_instruction_value() else {
        return false;
    };
    if depth > 32 {
        return false;
    }
    let pure = matches!(
        i.get_opcode(),
        Op::Add
            | Op::Sub
            | Op::Mul
            | Op::UDiv
            | Op::SDiv
            | Op::URem
            | Op::SRem
            | Op::Shl
            | Op::LShr
            | Op::AShr
            | Op::And
            | Op::Or
            | Op::Xor
            | Op::Trunc
            | Op::ZExt
            | Op::SExt
            | Op::PtrToInt
            | Op::IntToPtr
            | Op::BitCast
            | Op::AddrSpaceCast
            | Op::GetElementPtr
            | Op::ICmp
            | Op::Select
            | Op::Freeze
    );
    pure && i.get_operands().all(|o| match o {
        Some(inkwell::values::Operand::Value(o)) => is_warp_uniform(o, uniform, depth + 1),
        Some(inkwell::values::Operand::Block(_)) => false,
        None => true,
    })
}

/// Every instruction of `module` that `keep` picks, in order; collected before a pass
/// rewrites or erases any of them.
fn instructions_where<'ctx>(
    module: &Module<'ctx>,
    keep: impl Fn(inkwell::values::InstructionValue<'ctx>) -> bool,
) -> Vec<inkwell::values::InstructionValue<'ctx>> {
    module
        .get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .flat_map(|bb| bb.get_instructions())
        .filter(|&i| keep(i))
        .collect()
}

/// Rewrites atomic operations on the eBPF stack as plain loads and stores.
///
/// The stack is private to its thread, so nothing can observe the difference, and
/// GPUs have no atomics on private memory: LLVM 19's NVPTX backend aborts the whole
/// process ("Cannot select AtomicCmpSwap ... addrspace 5") once it proves an atomic's
/// address is local, and a generic atomic that lands in local memory is undefined in
/// PTX. Run it on the optimized module, just before code generation, when the
/// optimizer has exposed every stack address it will see. Returns how many it rewrote.
pub fn demote_stack_atomics(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{InstructionOpcode as Op, Operand};
    use inkwell::AtomicRMWBinOp as Rmw;
    let context = module.get_context();
    let builder = context.create_builder();
    let mut rewritten = 0;
    fn operand(
        i: inkwell::values::InstructionValue<'_>,
        n: u32,
    ) -> Result<inkwell::values::BasicValueEnum<'_>, CompileError> {
        match i.get_operand(n) {
            Some(Operand::Value(v)) => Ok(v),
            _ => Err(CompileError::InvalidIr {
                message: format!("atomic operation without operand {n}"),
            }),
        }
    }
    let on_stack = |i: inkwell::values::InstructionValue<'_>| {
        matches!(i.get_opcode(), Op::AtomicRMW | Op::AtomicCmpXchg)
            && matches!(i.get_operand(0), Some(Operand::Value(p)) if is_stack_address(p, 0))
    };
    for atomic in instructions_where(module, on_stack) {
        builder.position_before(&atomic);
        let ptr = operand(atomic, 0)?.into_pointer_value();
        let replacement = if atomic.get_opcode() == Op::AtomicRMW {
            let value = operand(atomic, 1)?.into_int_value();
            let old = builder
                .build_load(value.get_type(), ptr, "old")?
                .into_int_value();
            let new = match atomic.get_atomic_rmw_bin_op() {
                Some(Rmw::Add) => builder.build_int_add(old, value, "new")?,
                Some(Rmw::Sub) => builder.build_int_sub(old, value, "new")?,
                Some(Rmw::And) => builder.build_and(old, value, "new")?,
                Some(Rmw::Or) => builder.build_or(old, value, "new")?,
                Some(Rmw::Xor) => builder.build_xor(old, value, "new")?,
                Some(Rmw::Xchg) => value,
                other => {
                    return Err(CompileError::InvalidIr {
                        message: format!("unexpected atomic operation {other:?}"),
                    })
                }
            };
            builder.build_store(ptr, new)?;
            old.as_instruction()
        } else {
            let expected = operand(atomic, 1)?.into_int_value();
            let new = operand(atomic, 2)?.into_int_value();
            let ty = expected.get_type();
            let old = builder.build_load(ty, ptr, "old")?.into_int_value();
            let equal =
                builder.build_int_compare(inkwell::IntPredicate::EQ, old, expected, "equal")?;
            let stored = builder.build_select(equal, new, old, "stored")?;
            builder.build_store(ptr, stored)?;
            // cmpxchg yields { old, success }.
            let pair = context.struct_type(&[ty.into(), context.bool_type().into()], false);
            let with_old = builder.build_insert_value(pair.get_poison(), old, 0, "with_old")?;
            let result = builder.build_insert_value(with_old, equal, 1, "result")?;
            result.into_struct_value().as_instruction()
        };
        let replacement = replacement.ok_or_else(|| CompileError::InvalidIr {
            message: "stack atomic replacement folded to a constant".into(),
        })?;
        atomic.replace_all_uses_with(&replacement);
        atomic.erase_from_basic_block();
        rewritten += 1;
    }
    Ok(rewritten)
}

/// The library functions non-fetching atomic adds go through when the library defines
/// them (GPU attach's device runtime does): `u64 f(u64 addr, u64 value, u64, u64, u64)`,
/// for 64-bit and 32-bit adds. A counter that every thread of a kernel bumps is one
/// address for a whole warp; such a function sums the warp's values and makes one
/// atomic where the hardware would serialize 32.
pub const WARP_ADD_U64: &str = "bpftime_gpu_warp_add_u64";
pub const WARP_ADD_U32: &str = "bpftime_gpu_warp_add_u32";

/// Sends each `atomicrmw add` whose result is unused (eBPF's `lock add`, not `lock fetch
/// add`) through [`WARP_ADD_U64`] or [`WARP_ADD_U32`], where the module defines them.
/// Adds on the stack become plain again later (`demote_stack_atomics`, after inlining).
fn route_atomic_adds(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op, Operand};
    use inkwell::AtomicRMWBinOp as Rmw;
    let defined = |name| {
        module
            .get_function(name)
            .filter(|f| f.count_basic_blocks() > 0)
    };
    let (Some(add64), Some(add32)) = (defined(WARP_ADD_U64), defined(WARP_ADD_U32)) else {
        return Ok(0);
    };
    let context = module.get_context();
    let builder = context.create_builder();
    let i64t = context.i64_type();
    let mut routed = 0;
    // The warp adds themselves make plain atomics.
    let routable = |i: inkwell::values::InstructionValue<'_>| {
        i.get_opcode() == Op::AtomicRMW
            && i.get_atomic_rmw_bin_op() == Some(Rmw::Add)
            && i.get_first_use().is_none()
            && i.get_parent()
                .and_then(|bb| bb.get_parent())
                .is_some_and(|f| f != add64 && f != add32)
    };
    for add in instructions_where(module, routable) {
        let (Some(Operand::Value(ptr)), Some(Operand::Value(value))) =
            (add.get_operand(0), add.get_operand(1))
        else {
            continue;
        };
        let value = value.into_int_value();
        let target = match value.get_type().get_bit_width() {
            64 => add64,
            32 => add32,
            _ => continue,
        };
        builder.position_before(&add);
        let addr = builder.build_ptr_to_int(ptr.into_pointer_value(), i64t, "addr")?;
        let wide = builder.build_int_z_extend_or_bit_cast(value, i64t, "value")?;
        let zero = i64t.const_zero();
        builder.build_call(
            target,
            &[
                addr.into(),
                wide.into(),
                zero.into(),
                zero.into(),
                zero.into(),
            ],
            "",
        )?;
        let _ = add.as_any_value_enum();
        add.erase_from_basic_block();
        routed += 1;
    }
    Ok(routed)
}

/// The device runtime's question "is this value the same in every lane of the warp?",
/// which [`fold_uniform_warp_ops`] answers at compile time: 1 when it can prove so, else 0.
pub const KNOWN_UNIFORM: &str = "bpftime_gpu_known_uniform";

/// Folds warp-wide operations on values every lane holds alike: a `match.any.sync` of
/// one value is its member mask, and a `shfl.sync` of one value is that value; and
/// `isspacep.local` is true of the eBPF stack and false of an address made from a
/// constant one (an inlined array lookup's). A value every lane holds alike is a
/// constant, one of `uniform` (the probe's arguments that are the same across a warp's
/// call), or arithmetic on such values alone ([`is_warp_uniform`]). A counter's add then
/// needs no match and no shuffles: the device runtime's warp-aggregated add of a
/// constant to a constant address, or to an address made from the call site's
/// constants (memtrace's count per kernel and kind), reduces to one atomic of 32 times
/// the constant by the first lane. It also answers every [`KNOWN_UNIFORM`] question the
/// device runtime asks. Returns how many it folded.
pub fn fold_uniform_warp_ops<'ctx>(
    module: &Module<'ctx>,
    uniform: &[inkwell::values::BasicValueEnum<'ctx>],
) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, AsValueRef, InstructionOpcode as Op, Operand};
    let uniform: Vec<usize> = uniform.iter().map(|v| v.as_value_ref() as usize).collect();
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        let Some(name) = callee_name(call) else {
            continue;
        };
        if name == "llvm.nvvm.isspacep.local" {
            // An address made from a constant one is a relocated map's: device
            // memory, never a thread's stack. The stack is seen through the casts
            // from its slot.
            let Some(Operand::Value(ptr)) = call.get_operand(0) else {
                continue;
            };
            let this = call.as_any_value_enum();
            if !ptr.is_pointer_value() || !this.is_int_value() {
                continue;
            }
            let answer = if is_stack_address(ptr, 0) {
                1
            } else if is_map_address(ptr, 0) {
                0
            } else {
                continue;
            };
            let int = this.into_int_value();
            int.replace_all_uses_with(int.get_type().const_int(answer, false));
            call.erase_from_basic_block();
            folded += 1;
            continue;
        }
        if name == KNOWN_UNIFORM {
            // Answered now, whatever it is: the device runtime has no definition of it.
            let (Some(Operand::Value(value)), this) =
                (call.get_operand(0), call.as_any_value_enum())
            else {
                continue;
            };
            if !this.is_int_value() {
                continue;
            }
            let answer = u64::from(is_warp_uniform(value, &uniform, 0));
            let int = this.into_int_value();
            int.replace_all_uses_with(int.get_type().const_int(answer, false));
            call.erase_from_basic_block();
            folded += 1;
            continue;
        }
        // (intrinsic, operand that becomes the result)
        let keep = if name.starts_with("llvm.nvvm.match.any.sync.") {
            0
        } else if name.starts_with("llvm.nvvm.shfl.sync.") && !name.ends_with(".p") {
            1
        } else {
            continue;
        };
        let (Some(Operand::Value(value)), Some(Operand::Value(result))) =
            (call.get_operand(1), call.get_operand(keep))
        else {
            continue;
        };
        if !(value.is_int_value() && is_warp_uniform(value, &uniform, 0)) {
            continue;
        }
        let this = call.as_any_value_enum();
        if !this.is_int_value() || !result.is_int_value() {
            continue;
        }
        if this.into_int_value().get_type() != result.into_int_value().get_type() {
            continue;
        }
        this.into_int_value()
            .replace_all_uses_with(result.into_int_value());
        call.erase_from_basic_block();
        folded += 1;
    }
    drop_unused_declaration(module, KNOWN_UNIFORM);
    Ok(folded)
}

/// Turns the probe context back into pointer arithmetic: eBPF registers are integers,
/// so after inlining, the program's context reads are `inttoptr (ptrtoint %ctx + C)`,
/// which hides the context's stack slot from SROA. Each becomes a GEP from the slot,
/// after which SROA turns the reads at constant offsets into the values stored there
/// (the probe's arguments). Returns how many it rewrote.
pub fn fold_stack_pointer_casts<'ctx>(module: &Module<'ctx>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, BasicValue, BasicValueEnum, InstructionOpcode as Op};
    let context = module.get_context();
    let builder = context.create_builder();
    let i8t = context.i8_type();
    let mut rewritten = 0;
    let value_of = value_operand;
    // The alloca behind `v` when `v` is `ptrtoint %alloca`.
    let cast_alloca = |v: BasicValueEnum<'ctx>| {
        let i = v.as_instruction_value()?;
        if i.get_opcode() != Op::PtrToInt {
            return None;
        }
        let p = value_of(i, 0)?;
        let a = p.as_instruction_value()?;
        (a.get_opcode() == Op::Alloca).then(|| p.into_pointer_value())
    };
    for cast in instructions_where(module, |i| i.get_opcode() == Op::IntToPtr) {
        let Some(int) = value_of(cast, 0) else {
            continue;
        };
        let (base, offset) = if let Some(base) = cast_alloca(int) {
            (base, 0i64)
        } else {
            let Some(add) = int.as_instruction_value() else {
                continue;
            };
            if add.get_opcode() != Op::Add {
                continue;
            }
            let (Some(a), Some(b)) = (value_of(add, 0), value_of(add, 1)) else {
                continue;
            };
            let constant = |v: BasicValueEnum<'ctx>| {
                v.is_int_value()
                    .then(|| v.into_int_value())
                    .filter(|c| c.is_const())
                    .and_then(|c| c.get_sign_extended_constant())
            };
            match (cast_alloca(a), constant(b), cast_alloca(b), constant(a)) {
                (Some(base), Some(c), _, _) | (_, _, Some(base), Some(c)) => (base, c),
                _ => continue,
            }
        };
        builder.position_before(&cast);
        // SAFETY: (for LLVM) a byte offset from the slot; an out-of-bounds one is
        // as undefined as the integer arithmetic it replaces, and the verifier
        // keeps context reads inside the context.
        let gep = unsafe {
            builder.build_gep(
                i8t,
                base,
                &[context.i64_type().const_int(offset as u64, true)],
                "ctx_field",
            )?
        };
        let old = cast.as_any_value_enum().into_pointer_value();
        old.replace_all_uses_with(gep);
        cast.erase_from_basic_block();
        rewritten += 1;
    }
    Ok(rewritten)
}

#[cfg(test)]
mod fold_tests {
    use super::*;

    fn module<'ctx>(context: &'ctx Context, ir: &str) -> Module<'ctx> {
        let buffer = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "test");
        context
            .create_module_from_ir(buffer)
            .expect("test IR parses")
    }

    fn text(m: &Module<'_>) -> String {
        m.verify().expect("still valid IR");
        m.print_to_string().to_string()
    }

    const MATCH: &str = "declare i32 @llvm.nvvm.match.any.sync.i64(i32, i64)\n";

    /// A match of a value made from the arguments a warp's lanes share folds to its mask;
    /// one made from a lane's own argument, or through a phi (lanes may arrive by
    /// different edges), stays.
    /// The GPU's helpers are the registry's: each one marked for the GPU lowers, the
    /// way it is marked, and no other does.
    #[test]
    fn the_gpu_lowers_exactly_the_registry_gpu_helpers() {
        for d in bpftime_isa::helpers::REGISTRY {
            let lowered = standard_helper(d.id);
            match d.gpu {
                GpuImpl::None => assert_eq!(lowered, None, "{}", d.name),
                GpuImpl::Builtin => assert!(
                    matches!(lowered, Some(GpuHelper::Builtin(_))),
                    "{} is marked builtin but has no builtin",
                    d.name
                ),
                GpuImpl::Extern(n) => {
                    assert_eq!(
                        lowered,
                        Some(GpuHelper::Extern(n.to_string())),
                        "{}",
                        d.name
                    )
                }
            }
        }
        for id in 0..1024 {
            if bpftime_isa::helpers::lookup(id).is_none() {
                assert_eq!(
                    builtin(id),
                    None,
                    "builtin {id} is missing from the registry"
                );
            }
        }
    }

    #[test]
    fn matches_of_values_every_lane_shares_fold() {
        let context = Context::create();
        let m = module(
            &context,
            &format!(
                "{MATCH}define i32 @probe(i64 %site, i64 %addr, i1 %c) {{
entry:
  %k = and i64 %site, 4294967295
  %slot = shl i64 %k, 3
  %shared = add i64 %slot, 4096
  %a = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %shared)
  %own = add i64 %addr, %slot
  %b = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %own)
  br i1 %c, label %x, label %y
x:
  br label %y
y:
  %p = phi i64 [ %shared, %entry ], [ 8, %x ]
  %d = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %p)
  %s1 = add i32 %a, %b
  %s2 = add i32 %s1, %d
  ret i32 %s2
}}"
            ),
        );
        let f = m.get_function("probe").unwrap();
        let site = f.get_nth_param(0).unwrap();
        assert_eq!(fold_uniform_warp_ops(&m, &[site]).unwrap(), 1);
        let ir = text(&m);
        assert_eq!(
            ir.matches("call i32 @llvm.nvvm.match.any").count(),
            2,
            "{ir}"
        );
        assert!(!ir.contains("i64 %shared)"), "{ir}");
        // With no argument known to be shared, only constants fold (none here).
        let m = module(
            &context,
            &format!(
                "{MATCH}define i32 @probe(i64 %site) {{
  %a = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %site)
  ret i32 %a
}}"
            ),
        );
        assert_eq!(fold_uniform_warp_ops(&m, &[]).unwrap(), 0);
    }

    /// The runtime's question "is this address in `[LO, LO + LEN)`?" is answered yes when
    /// `addr` is made from a constant inside an array's values and every array it can be
    /// in lies in the range; no for an address from a constant outside every array, or
    /// when an array reaches past the range. A program's own compare of the same kind is
    /// left alone (it may compare a pointer it never dereferences).
    #[test]
    fn range_questions_about_addresses_in_arrays_are_answered() {
        let check = |base_a: u64, base_b: u64, extents: &[(u64, u64)]| {
            let context = Context::create();
            let m = module(
                &context,
                &format!(
                    "declare i1 @{KNOWN_IN_RANGE}(i64, i64, i64) nounwind willreturn memory(none)
define i1 @probe(i64 %slot, i1 %c) {{
entry:
  %off = shl i64 %slot, 3
  %b = add i64 %off, {base_b}
  br i1 %c, label %x, label %y
x:
  %a = or disjoint i64 %off, {base_a}
  br label %y
y:
  %addr = phi i64 [ %a, %x ], [ %b, %entry ]
  %known = call i1 @{KNOWN_IN_RANGE}(i64 %addr, i64 4096, i64 1024)
  %rel = add i64 %addr, -4096
  %own = icmp ult i64 %rel, 1024
  %both = and i1 %known, %own
  ret i1 %both
}}"
                ),
            );
            assert_eq!(fold_known_in_range(&m, extents).unwrap(), 1);
            let ir = text(&m);
            assert!(
                !ir.contains(KNOWN_IN_RANGE),
                "every question answered: {ir}"
            );
            assert!(ir.contains("icmp ult i64 %rel, 1024"), "{ir}");
            ir.contains("and i1 true, %own")
        };
        let arrays = [(4096, 4096 + 512), (4096 + 512, 4096 + 1024)];
        assert!(check(4096, 4096 + 512, &arrays));
        // One side from a constant in no array: the verifier says nothing about it.
        assert!(!check(4096, 8192, &arrays));
        // An array that reaches past the range.
        assert!(!check(
            4096,
            4096 + 512,
            &[(4096, 4096 + 512), (4096 + 512, 4096 + 2048)]
        ));
        assert!(!check(4096, 4096 + 512, &[]));
    }

    /// A log2's guarded count of leading zeros (`v < 2 ? 0 : (clz(v) << 3) ^ 504`, a
    /// histogram's slot offset) loses its compare: `clz(v | 1)` gives the guard's answer
    /// for 0 and 1 and the same count above. A guard answering something else, or a count
    /// used elsewhere too, stays.
    #[test]
    fn guarded_clz_becomes_the_clz_of_v_or_1() {
        let ir = |answer: u64, extra_use: bool| {
            format!(
                "declare i64 @llvm.ctlz.i64(i64, i1)
declare void @keep(i64)
define i64 @probe(i64 %v) {{
  %c = call i64 @llvm.ctlz.i64(i64 %v, i1 true)
  %s = shl i64 %c, 3
  %x = xor i64 %s, 504
  {}
  %lt = icmp ult i64 %v, 2
  %r = select i1 %lt, i64 {answer}, i64 %x
  ret i64 %r
}}",
                if extra_use {
                    "call void @keep(i64 %c)"
                } else {
                    ""
                }
            )
        };
        for (answer, extra_use, folds) in [(0, false, true), (8, false, false), (0, true, false)] {
            let context = Context::create();
            let m = module(&context, &ir(answer, extra_use));
            assert_eq!(fold_guarded_ctlz(&m).unwrap(), usize::from(folds));
            let text = text(&m);
            assert_eq!(!text.contains("select"), folds, "{text}");
            assert_eq!(text.contains("or i64 %v, 1"), folds, "{text}");
        }
        // The rewrite's premise, at the values where it matters.
        let slot = |lz: u32| (u64::from(lz) << 3) ^ 504;
        for v in [0u64, 1, 2, 3, 4, 7, 8, 1 << 40, u64::MAX] {
            let guarded = if v < 2 { 0 } else { slot(v.leading_zeros()) };
            assert_eq!(slot((v | 1).leading_zeros()), guarded, "{v}");
        }
    }

    /// clang's eBPF expansion of a count of leading zeros (smeared bits, a population
    /// count of their complement) becomes `llvm.ctlz` again, at 64 and 32 bits; a chain
    /// with a shift missing is some other computation and stays.
    #[test]
    fn smeared_population_counts_become_clz() {
        let smear = |bits: u32, shifts: &[u32]| {
            let mut body = String::new();
            let mut last = "%x".to_string();
            for (n, s) in shifts.iter().enumerate() {
                body.push_str(&format!(
                    "  %s{n} = lshr i{bits} {last}, {s}\n  %o{n} = or i{bits} %s{n}, {last}\n"
                ));
                last = format!("%o{n}");
            }
            format!(
                "declare i{bits} @llvm.ctpop.i{bits}(i{bits})
define i{bits} @probe(i{bits} %x) {{
{body}  %not = xor i{bits} {last}, -1
  %n = call i{bits} @llvm.ctpop.i{bits}(i{bits} %not)
  ret i{bits} %n
}}"
            )
        };
        for (bits, shifts, folds) in [
            (64, vec![1, 2, 4, 8, 16, 32], true),
            (32, vec![1, 2, 4, 8, 16], true),
            (64, vec![1, 2, 4, 16, 32], false),
        ] {
            let context = Context::create();
            let m = module(&context, &smear(bits, &shifts));
            assert_eq!(fold_smeared_ctlz(&m).unwrap(), usize::from(folds));
            let ir = text(&m);
            assert_eq!(ir.contains("@llvm.ctlz"), folds, "{ir}");
        }
    }
}
