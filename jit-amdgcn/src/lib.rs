//! Compiles lifted eBPF to AMDGCN code objects.
//!
//! [`compile`] lowers a program exactly as `bpftime-jit-ptx` does (the shared
//! [`bpftime_jit_gpu`] lowering: builtins for the special registers, the
//! runtime's helpers as external device functions, a probe function and a kernel) and
//! has LLVM's AMDGPU backend write a relocatable ELF code object for `gfx90a` or
//! `gfx942` (`amdgcn-amd-amdhsa`). The runtime links it, resolving the external
//! helpers, into the code object it loads.
//!
//! Registers on AMD GPUs:
//! - thread and block index: `llvm.amdgcn.workitem.id.*` and `llvm.amdgcn.workgroup.id.*`;
//!   block and grid size from the HSA dispatch packet (grid size in blocks, rounded up);
//! - time: `s_memrealtime` (through `llvm.readsteadycounter`), a constant 100 MHz clock
//!   on these chips, times 10 for nanoseconds;
//! - SM id: the compute unit, shader array and engine bits of `HW_REG_HW_ID` (unique
//!   within one XCC of a gfx942); warp id: its wave slot and SIMD bits; lane id:
//!   `mbcnt` over the whole wavefront.
//!
//! The eBPF stack is an `alloca` in the private address space (5), reached through a
//! flat pointer like every other eBPF pointer.

#![warn(unreachable_pub)]

use std::sync::OnceLock;
use std::time::Instant;

use bpftime_isa::Insn;
pub use bpftime_jit_gpu::CompileError;
use bpftime_jit_gpu::{
    build_module, call_int, demote_stack_atomics, extern_functions, intrinsic, Axis, Dimension,
    GpuBackend, SpecialRegister,
};
pub use bpftime_jit_gpu::{GpuEnv, GpuHelper, OptLevel, StandardGpuEnv};
use bpftime_lifter::optimize;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetData, TargetMachine,
    TargetTriple,
};
use inkwell::values::{FunctionValue, InstructionOpcode, IntValue};
use inkwell::{AddressSpace, AtomicOrdering, IntPredicate};
use tracing::debug;

const TRIPLE: &str = "amdgcn-amd-amdhsa";
/// `amdgpu_kernel`, LLVM's calling convention number for AMDGPU kernels.
const AMDGPU_KERNEL_CC: u32 = 91;
/// The private (scratch) address space, where allocas live.
const PRIVATE: u16 = 5;
/// `HW_REG_HW_ID`, all 32 bits, as `s_getreg_b32` encodes it: id | offset << 6 |
/// (size - 1) << 11.
const HW_ID_ALL: u64 = 4 | (31 << 11);

/// The AMD GPUs we compile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmdGpuArch {
    /// MI200 (CDNA2).
    Gfx90a,
    /// MI300 (CDNA3).
    Gfx942,
}

impl AmdGpuArch {
    pub fn name(self) -> &'static str {
        match self {
            AmdGpuArch::Gfx90a => "gfx90a",
            AmdGpuArch::Gfx942 => "gfx942",
        }
    }

    /// The `EF_AMDGPU_MACH` value in the low byte of the ELF header's `e_flags`.
    pub fn elf_mach(self) -> u32 {
        match self {
            AmdGpuArch::Gfx90a => 0x3f,
            AmdGpuArch::Gfx942 => 0x4c,
        }
    }
}

impl std::str::FromStr for AmdGpuArch {
    type Err = CompileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gfx90a" => Ok(AmdGpuArch::Gfx90a),
            "gfx942" => Ok(AmdGpuArch::Gfx942),
            other => Err(CompileError::InvalidOption {
                message: format!("`{other}` is not a target; pick gfx90a or gfx942"),
            }),
        }
    }
}

/// How to compile for AMDGCN.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AmdgcnOptions {
    pub arch: AmdGpuArch,
    pub opt_level: OptLevel,
    /// Name of the probe function; the kernel is `<symbol>_kernel`.
    pub symbol: String,
}

impl Default for AmdgcnOptions {
    fn default() -> Self {
        AmdgcnOptions {
            arch: AmdGpuArch::Gfx90a,
            opt_level: OptLevel::default(),
            symbol: "bpf_prog".to_string(),
        }
    }
}

/// A program compiled to a relocatable AMDGCN code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmdgcnObject {
    /// The ELF relocatable object.
    pub elf: Vec<u8>,
    pub arch: AmdGpuArch,
    /// The probe function, `u64 func(void *ctx)`.
    pub func: String,
    /// The kernel, `kernel(void *mem, u64 len, u64 *result)`.
    pub kernel: String,
    /// Device functions the object calls but does not define.
    pub externs: Vec<String>,
    /// The global `i64` that `ktime_get_ns` adds to the GPU's clock, when the program
    /// calls it; the runtime writes the host-clock offset into it before a launch.
    pub clock_offset: Option<String>,
}

struct Amdgpu {
    data_layout: String,
}

impl Amdgpu {
    fn call<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
        name: &str,
        args: &[inkwell::values::BasicMetadataValueEnum<'ctx>],
    ) -> Result<IntValue<'ctx>, CompileError> {
        let f = intrinsic(module, name, &[])?;
        call_int(builder, f, args, name)
    }

    /// A field of the HSA kernel dispatch packet (`hsa_kernel_dispatch_packet_t`), by
    /// its index in [`dispatch_packet_head`], widened to `i64`.
    fn dispatch_field<'ctx>(
        &self,
        module: &Module<'ctx>,
        builder: &Builder<'ctx>,
        field: u32,
    ) -> Result<IntValue<'ctx>, CompileError> {
        let context = module.get_context();
        let packet = intrinsic(module, "llvm.amdgcn.dispatch.ptr", &[])?;
        let packet = builder
            .build_call(packet, &[], "packet")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CompileError::InvalidIr {
                message: "dispatch.ptr returns nothing".into(),
            })?
            .into_pointer_value();
        let head = dispatch_packet_head(&context);
        let ptr = builder.build_struct_gep(head, packet, field, "field")?;
        let ty = head
            .get_field_type_at_index(field)
            .ok_or_else(|| CompileError::InvalidIr {
                message: format!("dispatch packet has no field {field}"),
            })?;
        let v = builder.build_load(ty, ptr, "dispatch")?.into_int_value();
        Ok(builder.build_int_z_extend(v, context.i64_type(), "dispatch64")?)
    }
}

/// The first 24 bytes of `hsa_kernel_dispatch_packet_t`: header, setup,
/// workgroup_size_{x,y,z} (u16, fields 2-4), reserved, grid_size_{x,y,z} (u32, in
/// work-items, fields 6-8).
fn dispatch_packet_head<'ctx>(
    context: &inkwell::context::ContextRef<'ctx>,
) -> inkwell::types::StructType<'ctx> {
    let i16t = context.i16_type().into();
    let i32t = context.i32_type().into();
    context.struct_type(
        &[i16t, i16t, i16t, i16t, i16t, i16t, i32t, i32t, i32t],
        false,
    )
}

fn axis_index(axis: Axis) -> u32 {
    match axis {
        Axis::X => 0,
        Axis::Y => 1,
        Axis::Z => 2,
    }
}

impl GpuBackend for Amdgpu {
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
        let context = module.get_context();
        let i64t = context.i64_type();
        let i32t = context.i32_type();
        let widen = |v: IntValue<'ctx>| builder.build_int_z_extend_or_bit_cast(v, i64t, "r64");
        let hw_id = || -> Result<IntValue<'ctx>, CompileError> {
            let v = self.call(
                module,
                builder,
                "llvm.amdgcn.s.getreg",
                &[i32t.const_int(HW_ID_ALL, false).into()],
            )?;
            Ok(widen(v)?)
        };
        Ok(match reg {
            SpecialRegister::GlobalTimerNs => {
                let f = intrinsic(module, "llvm.readsteadycounter", &[])?;
                let ticks = call_int(builder, f, &[], "ticks")?;
                builder.build_int_mul(ticks, i64t.const_int(10, false), "ns")?
            }
            SpecialRegister::SmId => {
                let hw = hw_id()?;
                let cu = builder.build_right_shift(hw, i64t.const_int(8, false), false, "cu")?;
                builder.build_and(cu, i64t.const_int(0xff, false), "sm")?
            }
            SpecialRegister::WarpId => {
                builder.build_and(hw_id()?, i64t.const_int(0x3f, false), "wave")?
            }
            SpecialRegister::LaneId => {
                let all = i32t.const_all_ones();
                let lo = self.call(
                    module,
                    builder,
                    "llvm.amdgcn.mbcnt.lo",
                    &[all.into(), i32t.const_zero().into()],
                )?;
                let lane = self.call(
                    module,
                    builder,
                    "llvm.amdgcn.mbcnt.hi",
                    &[all.into(), lo.into()],
                )?;
                widen(lane)?
            }
            SpecialRegister::Dim(Dimension::ThreadIdx, a) => {
                let v = self.call(
                    module,
                    builder,
                    &format!("llvm.amdgcn.workitem.id.{}", a.letter()),
                    &[],
                )?;
                widen(v)?
            }
            SpecialRegister::Dim(Dimension::BlockIdx, a) => {
                let v = self.call(
                    module,
                    builder,
                    &format!("llvm.amdgcn.workgroup.id.{}", a.letter()),
                    &[],
                )?;
                widen(v)?
            }
            SpecialRegister::Dim(Dimension::BlockDim, a) => {
                self.dispatch_field(module, builder, 2 + axis_index(a))?
            }
            SpecialRegister::Dim(Dimension::GridDim, a) => {
                let items = self.dispatch_field(module, builder, 6 + axis_index(a))?;
                let size = self.dispatch_field(module, builder, 2 + axis_index(a))?;
                // A real dispatch never has a zero-sized block; the guard keeps the
                // division defined regardless.
                let zero = builder.build_int_compare(
                    IntPredicate::EQ,
                    size,
                    i64t.const_zero(),
                    "empty",
                )?;
                let size = builder
                    .build_select(zero, i64t.const_int(1, false), size, "size")?
                    .into_int_value();
                let up = builder.build_int_add(items, size, "up")?;
                let up = builder.build_int_sub(up, i64t.const_int(1, false), "up1")?;
                builder.build_int_unsigned_div(up, size, "blocks")?
            }
        })
    }

    fn membar<'ctx>(
        &self,
        _module: &Module<'ctx>,
        builder: &Builder<'ctx>,
    ) -> Result<(), CompileError> {
        builder.build_fence(AtomicOrdering::SequentiallyConsistent, false, "")?;
        Ok(())
    }

    fn mark_kernel<'ctx>(
        &self,
        _module: &Module<'ctx>,
        kernel: FunctionValue<'ctx>,
    ) -> Result<(), CompileError> {
        kernel.set_call_conventions(AMDGPU_KERNEL_CC);
        Ok(())
    }

    /// The lifter's allocas are in address space 0, which AMDGPU does not allow:
    /// move each into the private space and hand its users a flat pointer to it.
    fn finish(&self, module: &Module<'_>) -> Result<(), CompileError> {
        let context = module.get_context();
        let builder = context.create_builder();
        let flat = context.ptr_type(AddressSpace::default());
        for f in module.get_functions() {
            for bb in f.get_basic_block_iter() {
                let allocas: Vec<_> = bb
                    .get_instructions()
                    .filter(|i| i.get_opcode() == InstructionOpcode::Alloca)
                    .filter(|i| {
                        i.get_type().is_pointer_type()
                            && i.get_type().into_pointer_type().get_address_space()
                                != AddressSpace::from(PRIVATE)
                    })
                    .collect();
                for old in allocas {
                    let ty = old
                        .get_allocated_type()
                        .map_err(|e| CompileError::InvalidIr {
                            message: e.to_string(),
                        })?;
                    builder.position_before(&old);
                    let new = builder.build_alloca(ty, "private")?;
                    if let (Ok(align), Some(i)) = (old.get_alignment(), new.as_instruction()) {
                        let _ = i.set_alignment(align);
                    }
                    let cast = builder.build_address_space_cast(new, flat, "flat")?;
                    let cast = cast
                        .as_instruction()
                        .ok_or_else(|| CompileError::InvalidIr {
                            message: "address space cast folded away".into(),
                        })?;
                    old.replace_all_uses_with(&cast);
                    old.erase_from_basic_block();
                }
            }
        }
        Ok(())
    }
}

fn amdgpu_machine(opts: &AmdgcnOptions) -> Result<TargetMachine, CompileError> {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| Target::initialize_amd_gpu(&InitializationConfig::default()));
    let triple = TargetTriple::create(TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| CompileError::Target {
        message: e.to_string(),
    })?;
    target
        .create_target_machine(
            &triple,
            opts.arch.name(),
            "",
            opts.opt_level.codegen(),
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CompileError::Target {
            message: format!(
                "LLVM cannot make an AMDGPU target machine for {}",
                opts.arch.name()
            ),
        })
}

/// Compiles `insns` to a relocatable AMDGCN code object.
pub fn compile(
    insns: &[Insn],
    env: &dyn GpuEnv,
    opts: &AmdgcnOptions,
) -> Result<AmdgcnObject, CompileError> {
    let _llvm = bpftime_lifter::llvm_in_use()?;
    let started = Instant::now();
    let context = Context::create();
    let machine = amdgpu_machine(opts)?;
    let backend = Amdgpu {
        data_layout: machine
            .get_target_data()
            .get_data_layout()
            .as_str()
            .to_string_lossy()
            .into_owned(),
    };
    let gpu = build_module(
        &context,
        insns,
        env,
        &backend,
        &opts.symbol,
        true,
        &bpftime_jit_gpu::ProbeAbi::Context,
    )?;
    optimize(&gpu.module, &machine, opts.opt_level.pipeline())?;
    demote_stack_atomics(&gpu.module)?;
    let externs = extern_functions(&gpu.module);
    let buffer = machine
        .write_to_memory_buffer(&gpu.module, FileType::Object)
        .map_err(|e| CompileError::Codegen {
            message: e.to_string(),
        })?;
    let elf = buffer.as_slice().to_vec();
    debug!(
        insns = insns.len(),
        elf_bytes = elf.len(),
        arch = opts.arch.name(),
        us = started.elapsed().as_micros() as u64,
        "compiled eBPF program to AMDGCN"
    );
    Ok(AmdgcnObject {
        elf,
        arch: opts.arch,
        func: gpu.func,
        kernel: gpu.kernel.unwrap_or_default(),
        clock_offset: gpu.clock_offset,
        externs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_isa::asm::assemble;
    use bpftime_isa::uapi::helper as h;
    use goblin::elf::Elf;

    const EM_AMDGPU: u16 = 224;
    const OBJDUMP: &str = "llvm-objdump-19";

    fn object(src: &str, arch: AmdGpuArch) -> AmdgcnObject {
        let insns = assemble(src).expect("assembles");
        let opts = AmdgcnOptions {
            arch,
            ..AmdgcnOptions::default()
        };
        compile(&insns, &StandardGpuEnv, &opts).expect("compiles")
    }

    /// The disassembly of `elf`, or `None` (with the reason on stderr) where
    /// llvm-objdump-19 is not installed.
    fn disassemble(elf: &[u8], arch: AmdGpuArch) -> Option<String> {
        // One file per call: tests run in parallel threads of one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("bpftime-amdgcn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}-{call}.o", arch.name()));
        std::fs::write(&path, elf).unwrap();
        let out = std::process::Command::new(OBJDUMP)
            .arg("-d")
            .arg(format!("--mcpu={}", arch.name()))
            .arg(&path)
            .output();
        let _ = std::fs::remove_file(&path);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                eprintln!(
                    "{OBJDUMP} cannot run ({e}); not disassembling (apt-get install llvm-19)"
                );
                return None;
            }
        };
        assert!(
            out.status.success(),
            "{OBJDUMP} refused the object: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn objects_are_amdgpu_elf_for_their_chip_with_both_entry_points() {
        for arch in [AmdGpuArch::Gfx90a, AmdGpuArch::Gfx942] {
            let o = object("ldxw %r0, [%r1+4]\nadd %r0, %r2\nexit", arch);
            let elf = Elf::parse(&o.elf).expect("parses as ELF");
            assert_eq!(elf.header.e_machine, EM_AMDGPU);
            assert_eq!(elf.header.e_type, goblin::elf::header::ET_REL);
            assert_eq!(
                elf.header.e_flags & 0xff,
                arch.elf_mach(),
                "{}",
                arch.name()
            );
            let names: Vec<&str> = elf
                .syms
                .iter()
                .filter_map(|s| elf.strtab.get_at(s.st_name))
                .collect();
            assert!(names.contains(&"bpf_prog"), "{names:?}");
            assert!(names.contains(&"bpf_prog_kernel"), "{names:?}");
            // A kernel gets a kernel descriptor.
            assert!(names.contains(&"bpf_prog_kernel.kd"), "{names:?}");
            assert!(o.externs.is_empty());
            if let Some(text) = disassemble(&o.elf, arch) {
                assert!(text.contains("<bpf_prog_kernel>:"), "{text}");
                assert!(text.contains("s_endpgm"), "{text}");
            }
        }
        assert!("gfx1100".parse::<AmdGpuArch>().is_err());
    }

    #[test]
    fn special_registers_use_amdgcn_sources() {
        let xyz = |id: u32| {
            format!(
                "mov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\n\
                 add %r3, -24\ncall {id}\nldxdw %r6, [%r10-8]\nldxdw %r7, [%r10-16]\n\
                 ldxdw %r8, [%r10-24]\nadd %r0, %r6\nadd %r0, %r7\nadd %r0, %r8\nexit"
            )
        };
        let cases: Vec<(String, &[&str])> = vec![
            (
                format!("call {}\nexit", h::GPU_GLOBALTIMER),
                &["s_memrealtime"],
            ),
            (
                format!("call {}\nexit", h::GPU_SM_ID),
                &["hwreg(HW_REG_HW_ID"],
            ),
            (
                format!("call {}\nexit", h::GPU_LANE_ID),
                &["v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32"],
            ),
            (format!("call {}\nexit", h::GPU_MEMBAR), &["buffer_wbl2"]),
            // Grid size divides the dispatch packet's work-item count by the block size.
            (xyz(h::GPU_GRID_DIM), &["s_load_dword"]),
        ];
        for (src, needles) in cases {
            let o = object(&src, AmdGpuArch::Gfx90a);
            assert!(o.externs.is_empty(), "{src}: {:?}", o.externs);
            let Some(text) = disassemble(&o.elf, AmdGpuArch::Gfx90a) else {
                return;
            };
            for needle in needles {
                assert!(text.contains(needle), "{src}: no {needle} in\n{text}");
            }
        }
    }

    #[test]
    fn runtime_helpers_stay_undefined_and_the_stack_is_private() {
        let o = object(
            "mov %r1, %r10\nadd %r1, -8\nstdw [%r10-8], 7\ncall 501\nldxdw %r0, [%r10-8]\nexit",
            AmdGpuArch::Gfx942,
        );
        assert_eq!(o.externs, vec!["bpftime_gpu_puts".to_string()]);
        let elf = Elf::parse(&o.elf).unwrap();
        let undefined: Vec<&str> = elf
            .syms
            .iter()
            .filter(|s| s.st_shndx == 0 && s.st_name != 0)
            .filter_map(|s| elf.strtab.get_at(s.st_name))
            .collect();
        assert!(undefined.contains(&"bpftime_gpu_puts"), "{undefined:?}");
        if let Some(text) = disassemble(&o.elf, AmdGpuArch::Gfx942) {
            // The escaped stack slot is scratch memory.
            assert!(
                text.contains("scratch_") || text.contains("buffer_store"),
                "{text}"
            );
        }
    }
}
