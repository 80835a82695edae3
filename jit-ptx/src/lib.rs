//! Compiles lifted eBPF to PTX for NVIDIA GPUs.
//!
//! [`compile`] lifts a program with `bpftime-lifter`, lowers its helpers for the GPU
//! ([`gpu`]: special registers inside the module, runtime helpers as `.extern .func`
//! device functions), optimizes it and has LLVM's NVPTX backend write PTX text with
//! two ways in: a `.visible .func` probe that an instrumented kernel calls with its
//! context pointer, and a `.visible .entry` kernel that runs the program on its own
//! over a buffer. The output targets `sm_70` to `sm_90` (default `sm_90`) with an
//! explicit PTX ISA version (default 7.8, at most 8.5, the newest LLVM 19 writes; the
//! device's driver reads up to 9.0).
//!
//! The part every GPU backend shares (which helper becomes what, the names of the
//! runtime's device functions, the probe and kernel wrappers, the IR folds) is
//! `bpftime-jit-gpu`'s, re-exported here as [`gpu`].

#![warn(unreachable_pub)]

mod ptx;

/// The GPU half of lowering, which every GPU backend shares.
pub use bpftime_jit_gpu as gpu;

pub use bpftime_jit_gpu::CompileError;
pub use bpftime_jit_gpu::{
    extern_helpers, GpuEnv, GpuHelper, OptLevel, ProbeAbi, StandardGpuEnv, KNOWN_IN_RANGE,
    KNOWN_UNIFORM,
};
pub use bpftime_lifter::{ArrayMapLayout, LiftError, PerCpuCopies};
pub use ptx::{compile, lifted_ir, PtxOptions, PtxProgram, PtxVersion};

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_isa::asm::assemble;
    use bpftime_isa::uapi::helper as h;

    fn ptx(src: &str) -> PtxProgram {
        ptx_with(src, &StandardGpuEnv, &PtxOptions::default())
    }

    fn ptx_with(src: &str, env: &dyn GpuEnv, opts: &PtxOptions) -> PtxProgram {
        let insns = assemble(src).expect("assembles");
        compile(&insns, env, opts).expect("compiles")
    }

    /// The body of the function or kernel `name` in `ptx`, from its header to the
    /// closing brace.
    fn body<'a>(ptx: &'a str, header: &str) -> &'a str {
        let start = ptx
            .find(header)
            .unwrap_or_else(|| panic!("`{header}` missing from:\n{ptx}"));
        let end = ptx[start..].find("\n}").map_or(ptx.len(), |e| start + e);
        &ptx[start..end]
    }

    #[test]
    fn the_same_program_is_the_same_text_however_many_were_compiled_before() {
        // The driver's JIT cache keys on the text: a counter of calls that LLVM keeps
        // across compilations must not show in it.
        let opts = PtxOptions {
            opt_level: OptLevel::O0,
            ..PtxOptions::default()
        };
        let src = "mov %r1, 2\ncall local sub\nexit\nsub:\nmov %r0, %r1\nexit";
        let first = ptx_with(src, &StandardGpuEnv, &opts).ptx;
        assert!(first.contains("call"), "{first}");
        for _ in 0..3 {
            assert_eq!(ptx_with(src, &StandardGpuEnv, &opts).ptx, first);
        }
        assert!(!first.contains("callseq"), "{first}");
    }

    #[test]
    fn header_names_version_and_target() {
        let p = ptx("mov %r0, 1\nexit");
        assert!(p.ptx.contains(".version 7.8\n"), "{}", p.ptx);
        assert!(p.ptx.contains(".target sm_90\n"), "{}", p.ptx);
        assert!(p.ptx.contains(".address_size 64"), "{}", p.ptx);
        let opts = PtxOptions {
            sm: 80,
            ptx_version: PtxVersion::new(8, 5),
            ..PtxOptions::default()
        };
        let p = ptx_with("mov %r0, 1\nexit", &StandardGpuEnv, &opts);
        assert!(p.ptx.contains(".version 8.5\n") && p.ptx.contains(".target sm_80\n"));
    }

    #[test]
    fn func_takes_ctx_and_returns_r0_and_kernel_stores_r0() {
        // r0 = *(u32 *)(r1 + 4) + r2: the kernel passes mem and len, the probe ctx and 0.
        let p = ptx("ldxw %r0, [%r1+4]\nadd %r0, %r2\nexit");
        assert_eq!(p.func, "bpf_prog");
        assert_eq!(p.kernel.as_deref(), Some("bpf_prog_kernel"));
        assert!(p.externs.is_empty());
        let func = body(
            &p.ptx,
            ".visible .func  (.param .b64 func_retval0) bpf_prog(",
        );
        assert!(func.contains(".param .b64 bpf_prog_param_0"), "{func}");
        assert!(func.contains("st.param.b64 \t[func_retval0+0]"), "{func}");
        let kernel = body(&p.ptx, ".visible .entry bpf_prog_kernel(");
        for i in 0..3 {
            assert!(
                kernel.contains(&format!(".param .u64 bpf_prog_kernel_param_{i}")),
                "{kernel}"
            );
        }
        // r0 goes out through the third parameter.
        assert!(kernel.contains("bpf_prog_kernel_param_2"), "{kernel}");
        assert!(
            kernel.contains("st.global.u64") || kernel.contains("st.u64"),
            "{kernel}"
        );
    }

    #[test]
    fn symbol_option_names_both_entry_points_and_prefixes_internals() {
        let opts = PtxOptions {
            symbol: "probe_7".into(),
            opt_level: OptLevel::O0,
            ..PtxOptions::default()
        };
        // A subprogram stays a function at O0; its name must carry the prefix.
        let p = ptx_with(
            "mov %r1, 2\ncall local sub\nexit\nsub:\nmov %r0, %r1\nexit",
            &StandardGpuEnv,
            &opts,
        );
        assert!(p.ptx.contains(".visible .entry probe_7_kernel("));
        assert!(p.ptx.contains(") probe_7("));
        assert!(p.ptx.contains("probe_7__bpf_sub_"), "{}", p.ptx);
        assert!(!p
            .ptx
            .contains(".visible .func  (.param .b64 func_retval0) bpf_sub"));
        let bad = PtxOptions {
            symbol: "9lives".into(),
            ..PtxOptions::default()
        };
        let err = compile(
            &assemble("mov %r0, 0\nexit").unwrap(),
            &StandardGpuEnv,
            &bad,
        )
        .expect_err("a symbol starting with a digit");
        assert!(err.to_string().contains("9lives"), "{err}");
    }

    #[test]
    fn stack_lives_in_local_memory() {
        let p = ptx("stxdw [%r10-8], %r1\nldxdw %r0, [%r10-8]\nexit");
        // Stored and reloaded through the same slot: LLVM keeps it in a register.
        assert!(!p.ptx.contains("__local_depot"), "{}", p.ptx);
        // A stack address that escapes (passed to a helper) needs real local memory.
        let p = ptx(
            "mov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\n\
             add %r3, -24\ncall 505\nldxdw %r0, [%r10-8]\nexit",
        );
        assert!(
            p.ptx.contains(".local .align 8 .b8 \t__local_depot"),
            "{}",
            p.ptx
        );
    }

    #[test]
    fn special_registers_lower_to_ptx_registers() {
        let cases: &[(u32, &[&str])] = &[
            (h::GPU_GLOBALTIMER, &["%globaltimer"]),
            (h::KTIME_GET_NS, &["%globaltimer"]),
            (h::GPU_SM_ID, &["%smid"]),
            (h::GET_SMP_PROCESSOR_ID, &["%smid"]),
            (h::GPU_WARP_ID, &["%warpid"]),
            (h::GPU_LANE_ID, &["%laneid"]),
            (h::GPU_BLOCK_IDX, &["%ctaid.x", "%ctaid.y", "%ctaid.z"]),
            (h::GPU_BLOCK_DIM, &["%ntid.x", "%ntid.y", "%ntid.z"]),
            (h::GPU_THREAD_IDX, &["%tid.x", "%tid.y", "%tid.z"]),
            (h::GPU_GRID_DIM, &["%nctaid.x", "%nctaid.y", "%nctaid.z"]),
            (h::GPU_MEMBAR, &["membar.sys"]),
        ];
        for &(id, regs) in cases {
            let three_outputs = regs.len() == 3;
            let src = if three_outputs {
                // Three stack slots for x, y and z, summed into r0.
                format!(
                    "mov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\n\
                     add %r3, -24\ncall {id}\nldxdw %r6, [%r10-8]\nldxdw %r7, [%r10-16]\n\
                     ldxdw %r8, [%r10-24]\nadd %r0, %r6\nadd %r0, %r7\nadd %r0, %r8\nexit"
                )
            } else {
                format!("call {id}\nexit")
            };
            let p = ptx(&src);
            for reg in regs {
                assert!(p.ptx.contains(reg), "helper {id}: no {reg} in\n{}", p.ptx);
            }
            assert!(p.externs.is_empty(), "helper {id}: {:?}", p.externs);
            assert!(!p.ptx.contains(".extern"), "helper {id}:\n{}", p.ptx);
        }
    }

    #[test]
    fn runtime_helpers_are_extern_device_functions() {
        for (id, name) in extern_helpers() {
            let p = ptx(&format!("call {id}\nexit"));
            assert_eq!(p.externs, vec![name.to_string()], "helper {id}");
            let decl = format!(".extern .func  (.param .b64 func_retval0) {name}\n(");
            assert!(
                p.ptx.contains(&decl),
                "helper {id}: no `{decl}` in\n{}",
                p.ptx
            );
            let start = p.ptx.find(&decl).unwrap();
            let end = start + p.ptx[start..].find("\n;").expect("declaration ends");
            // r0 and five arguments.
            assert_eq!(
                p.ptx[start..end].matches(".param .b64").count(),
                6,
                "{}",
                p.ptx
            );
            assert!(p.ptx.contains(&format!("call.uni (retval0), \n\t{name},")));
        }
    }

    #[test]
    fn helpers_a_gpu_lacks_are_refused_naming_id_and_pc() {
        let insns = assemble("mov %r0, 0\ncall 16\nexit").unwrap(); // get_current_comm
        let err = compile(&insns, &StandardGpuEnv, &PtxOptions::default())
            .expect_err("get_current_comm has no GPU lowering");
        assert!(
            matches!(
                err,
                CompileError::Lift {
                    source: LiftError::UnknownHelper { pc: 1, id: 16 }
                }
            ),
            "{err}"
        );
    }

    struct Inlined;

    impl GpuEnv for Inlined {
        fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
            (map == 0x7000_0000).then_some(ArrayMapLayout {
                values: 0x7f00_0000_0000,
                key_stride: 16,
                max_entries: 4,
                update_size: 16,
                per_cpu: None,
            })
        }
    }

    #[test]
    fn array_map_lookups_inline_to_device_addresses() {
        let src = "stw [%r10-4], 3\nlddw %r1, 0x70000000\nmov %r2, %r10\nadd %r2, -4\n\
                   call 1\nexit";
        let p = ptx_with(src, &Inlined, &PtxOptions::default());
        assert!(p.externs.is_empty(), "{:?}\n{}", p.externs, p.ptx);
        // values + key * 16, with the key bounds-checked against 4 entries.
        assert!(
            p.ptx.contains(&0x7f00_0000_0000u64.to_string()),
            "{}",
            p.ptx
        );
        assert!(
            p.ptx.contains("setp.lt.u32") && p.ptx.contains(", 4;"),
            "{}",
            p.ptx
        );
        let p = ptx(src);
        assert_eq!(p.externs, vec!["bpftime_gpu_map_lookup_elem".to_string()]);
    }

    struct Library;

    impl GpuEnv for Library {
        fn helper(&self, id: u32) -> Option<GpuHelper> {
            match id {
                7 => Some(GpuHelper::Extern("triple".into())),
                _ => gpu::standard_helper(id),
            }
        }

        fn library(&self) -> Option<&str> {
            Some("define i64 @triple(i64 %a, i64 %b, i64 %c, i64 %d, i64 %e) {\n  %r = mul i64 %a, 3\n  ret i64 %r\n}\n")
        }
    }

    #[test]
    fn library_definitions_link_in_and_stay_internal() {
        let p = ptx_with("mov %r1, 5\ncall 7\nexit", &Library, &PtxOptions::default());
        assert!(p.externs.is_empty(), "{:?}", p.externs);
        assert!(!p.ptx.contains("triple"), "inlined and dropped:\n{}", p.ptx);
        // callx reaches library helpers and builtins, never the runtime's externs.
        let p = ptx_with("mov %r1, 5\nmov %r8, 7\ncallx %r8\nexit", &Library, &{
            PtxOptions {
                opt_level: OptLevel::O0,
                ..PtxOptions::default()
            }
        });
        assert!(p.externs.is_empty(), "{:?}", p.externs);
        assert!(p.ptx.contains("bpf_prog__triple"), "{}", p.ptx);

        struct Broken;
        impl GpuEnv for Broken {
            fn library(&self) -> Option<&str> {
                Some("define i64 @f( {")
            }
        }
        let err = compile(
            &assemble("mov %r0, 0\nexit").unwrap(),
            &Broken,
            &PtxOptions::default(),
        )
        .expect_err("a library that does not parse");
        assert!(matches!(err, CompileError::Library { .. }), "{err}");
    }

    /// A library as bitcode that declares what its text part defines, with a function
    /// nothing calls.
    struct BitcodeLibrary {
        bitcode: Vec<u8>,
    }

    impl BitcodeLibrary {
        fn new() -> BitcodeLibrary {
            let context = inkwell::context::Context::create();
            let ir = "declare i64 @factor()\n\
                      define i64 @scaled(i64 %a, i64 %b, i64 %c, i64 %d, i64 %e) {\n  \
                      %f = call i64 @factor()\n  %r = mul i64 %a, %f\n  ret i64 %r\n}\n\
                      define i64 @never_called(i64 %a) {\n  %r = udiv i64 %a, 7\n  ret i64 %r\n}\n";
            let buffer = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
                ir.as_bytes(),
                "test",
            );
            let module = context.create_module_from_ir(buffer).expect("parses");
            BitcodeLibrary {
                bitcode: module.write_bitcode_to_memory().as_slice().to_vec(),
            }
        }
    }

    impl GpuEnv for BitcodeLibrary {
        fn helper(&self, id: u32) -> Option<GpuHelper> {
            match id {
                7 => Some(GpuHelper::Extern("scaled".into())),
                _ => gpu::standard_helper(id),
            }
        }

        fn library(&self) -> Option<&str> {
            Some("define i64 @factor() {\n  ret i64 5\n}\n")
        }

        fn library_bitcode(&self) -> Option<&[u8]> {
            Some(&self.bitcode)
        }
    }

    #[test]
    fn a_bitcode_library_links_with_its_text_and_only_what_is_called_stays() {
        let env = BitcodeLibrary::new();
        let opts = PtxOptions {
            opt_level: OptLevel::O0,
            ..PtxOptions::default()
        };
        let p = ptx_with("mov %r1, 5\ncall 7\nexit", &env, &opts);
        assert!(p.externs.is_empty(), "{:?}", p.externs);
        assert!(p.ptx.contains("bpf_prog__scaled"), "{}", p.ptx);
        assert!(p.ptx.contains("bpf_prog__factor"), "{}", p.ptx);
        assert!(!p.ptx.contains("never_called"), "{}", p.ptx);
        // Optimized, the call folds to 25.
        let p = ptx_with("mov %r1, 5\ncall 7\nexit", &env, &PtxOptions::default());
        assert!(p.ptx.contains("25"), "{}", p.ptx);
    }

    #[test]
    fn bad_targets_are_refused_with_the_way_out() {
        let insns = assemble("mov %r0, 0\nexit").unwrap();
        let try_opts = |sm, major, minor| {
            compile(
                &insns,
                &StandardGpuEnv,
                &PtxOptions {
                    sm,
                    ptx_version: PtxVersion::new(major, minor),
                    ..PtxOptions::default()
                },
            )
        };
        let e = try_opts(61, 7, 8).expect_err("sm_61 is older than sm_70");
        assert!(e.to_string().contains("sm_70"), "{e}");
        let e = try_opts(90, 7, 0).expect_err("sm_90 needs PTX 7.8");
        assert!(e.to_string().contains("needs PTX 7.8"), "{e}");
        let e = try_opts(90, 9, 0).expect_err("LLVM 19 writes at most PTX 8.5");
        assert!(e.to_string().contains("8.5"), "{e}");
        for (sm, major, minor) in [(70, 6, 0), (75, 7, 8), (86, 7, 1), (90, 8, 5)] {
            let p = try_opts(sm, major, minor).expect("a supported pair compiles");
            assert!(p.ptx.contains(&format!(".target sm_{sm}\n")));
            assert!(p.ptx.contains(&format!(".version {major}.{minor}\n")));
        }
    }

    #[test]
    fn atomics_stay_atomic_on_memory_and_become_plain_on_the_stack() {
        // LLVM 19's NVPTX backend aborts the process on a cmpxchg it proves local;
        // stack atomics must be rewritten before it sees them.
        let p = ptx(
            "stdw [%r10-8], 5\nmov %r0, 5\nmov %r2, 9\nlock cmpxchg [%r10-8], %r2\n\
             lock fetch add [%r10-8], %r2\nlock xchg32 [%r10-16], %r2\nldxdw %r0, [%r10-8]\nexit",
        );
        assert!(!p.ptx.contains("atom"), "{}", p.ptx);
        let p = ptx(
            "mov %r2, 1\nlock add [%r1+0], %r2\nmov %r0, 0\nlock cmpxchg [%r1+8], %r2\n\
             mov %r3, %r10\nadd %r3, -8\nstdw [%r10-8], 0\nlock add [%r3+0], %r2\nexit",
        );
        assert!(p.ptx.contains("atom.add.u64"), "{}", p.ptx);
        assert!(p.ptx.contains("atom.cas.b64"), "{}", p.ptx);
        // Two atomics in each of the probe function and the kernel; the third access,
        // through a copy of r10, is the stack's and plain.
        assert_eq!(p.ptx.matches("atom.").count(), 4, "{}", p.ptx);
    }

    #[test]
    fn memory_accesses_are_whole_when_aligned_and_bytewise_only_when_not() {
        // Through a pointer of unknown alignment: an aligned path with one 8-byte load
        // and store, a byte-wise path for the misaligned case, chosen by the low bits.
        let p = ptx("ldxdw %r0, [%r1+0]\nstxdw [%r1+8], %r0\nexit");
        let kernel = body(&p.ptx, ".entry bpf_prog_kernel");
        // The kernel's own buffer may be inferred global: `ld.global.u64`.
        let has = |op: &str, width: &str| {
            kernel.contains(&format!("{op}.{width}"))
                || kernel.contains(&format!("{op}.global.{width}"))
        };
        assert!(kernel.contains("and.b64"), "{kernel}");
        assert!(has("ld", "u64") && has("st", "u64"), "{kernel}");
        assert!(has("ld", "u8") && has("st", "u8"), "{kernel}");
        // Stack slots are aligned by their offset: no test, no bytes.
        let p = ptx(
            "stdw [%r10-8], 7\nmov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\n\
             mov %r3, %r10\nadd %r3, -24\ncall 505\nldxdw %r0, [%r10-8]\nldxw %r1, [%r10-12]\n\
             add %r0, %r1\nexit",
        );
        let kernel = body(&p.ptx, ".entry bpf_prog_kernel");
        assert!(!kernel.contains(".u8"), "{kernel}");
        assert!(!kernel.contains("and.b64"), "{kernel}");
    }

    #[test]
    fn ktime_adds_a_clock_offset_the_runtime_sets() {
        let p = ptx("call 5\nexit");
        assert_eq!(p.clock_offset.as_deref(), Some("bpf_prog__clock_offset_ns"));
        assert!(
            p.ptx
                .contains(".visible .global .align 8 .u64 bpf_prog__clock_offset_ns"),
            "{}",
            p.ptx
        );
        let kernel = body(&p.ptx, ".entry bpf_prog_kernel");
        assert!(kernel.contains("%globaltimer"), "{kernel}");
        assert!(kernel.contains("bpf_prog__clock_offset_ns"), "{kernel}");
        // The raw timer (502) needs no offset, and a program without clocks has none.
        assert_eq!(ptx("call 502\nexit").clock_offset, None);
        assert_eq!(ptx("mov %r0, 1\nexit").clock_offset, None);
    }
}

#[cfg(test)]
mod probe_abi_tests {
    use super::*;
    use bpftime_isa::asm::assemble;

    fn args_abi() -> PtxOptions {
        PtxOptions {
            kernel: false,
            probe_abi: ProbeAbi::Arguments {
                size: 168,
                offsets: vec![112, 104, 96, 88, 72, 64],
                uniform: 0x3f,
            },
            ..PtxOptions::default()
        }
    }

    #[test]
    fn context_reads_become_arguments_and_leave_no_local_memory() {
        // r0 = PARM1 + PARM4 (di at 112, cx at 88) + the ip slot (128), which is 0.
        let prog = assemble(
            "ldxdw %r0, [%r1+112]\nldxdw %r2, [%r1+88]\nadd %r0, %r2\nldxdw %r2, [%r1+128]\n\
             add %r0, %r2\nexit",
        )
        .unwrap();
        let p = compile(&prog, &StandardGpuEnv, &args_abi()).unwrap();
        assert!(p.kernel.is_none());
        assert!(!p.ptx.contains(".local"), "{}", p.ptx);
        assert!(!p.ptx.contains(".entry"), "{}", p.ptx);
        let func = &p.ptx[p.ptx.find(".visible .func").unwrap()..];
        assert_eq!(
            func.matches(".param .b64 bpf_prog_param_").count(),
            6,
            "{func}"
        );
        // An empty probe is an empty function.
        let p = compile(
            &assemble("mov %r0, 0\nexit").unwrap(),
            &StandardGpuEnv,
            &args_abi(),
        )
        .unwrap();
        assert!(
            !p.ptx.contains(".local") && !p.ptx.contains("st.local"),
            "{}",
            p.ptx
        );
        let bad = PtxOptions {
            probe_abi: ProbeAbi::Arguments {
                size: 16,
                offsets: vec![12],
                uniform: 0,
            },
            ..args_abi()
        };
        assert!(compile(
            &assemble("mov %r0, 0\nexit").unwrap(),
            &StandardGpuEnv,
            &bad
        )
        .is_err());
    }
}
