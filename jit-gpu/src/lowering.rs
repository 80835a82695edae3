//! Helpers, builtins, the probe and kernel wrappers: a lifted program made a GPU module.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use bpftime_isa::helpers::{self, Engine, GpuImpl};
use bpftime_isa::uapi::helper as h;
use bpftime_isa::Insn;
use bpftime_lifter::{lift, ArrayMapLayout, HelperLowering, LoweringTarget};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use inkwell::values::{FunctionValue, IntValue};
use inkwell::AddressSpace;

use crate::ir::call_int;
use crate::passes::{route_atomic_adds, WARP_ADD_U32, WARP_ADD_U64};
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
pub(crate) fn builtin(id: u32) -> Option<Builtin> {
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
