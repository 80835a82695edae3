//! Fatbins and PTX splicing on real nvcc output (CUDA 13.0, gpu-ptx/tests/fixtures/make.sh) and
//! on hand-written PTX with every way a kernel can end, checked by NVIDIA's `ptxas`
//! without a GPU. ptxas is found as `bpftime_gpu_ptx::toolchain` says; without it
//! these tests fail unless `BPFTIME_NO_PTXAS` is set, which they say.

mod support;

use support::{assert_ptxas_accepts, assert_ptxas_accepts_for, kernel_named, nvcc_module, read};

use bpftime_gpu_ptx::fatbin::{self, EntryKind, FatbinError, Image, FLAG_ZSTD};
use bpftime_gpu_ptx::ptx::{
    AccessKind, AccessSpace, ParamType, ProbeCall, ProbePoint, PtxError, PtxModule, SiteSpace,
    Splice, Version,
};
use bpftime_isa::asm::assemble;
use bpftime_jit_ptx::{compile, PtxOptions, PtxVersion, StandardGpuEnv};

/// A probe that reads every argument slot of the context and the host clock, and sums
/// them, so nothing is optimized away: what a `BPF_KPROBE` program touches.
const PROBE: &str = "
ldxdw %r2, [%r1+112]
ldxdw %r3, [%r1+104]
add %r2, %r3
ldxdw %r3, [%r1+96]
add %r2, %r3
ldxdw %r3, [%r1+88]
add %r2, %r3
ldxdw %r3, [%r1+72]
add %r2, %r3
ldxdw %r3, [%r1+64]
add %r2, %r3
mov %r6, %r2
call 5
add %r0, %r6
exit
";

/// The probe compiled as a function named `symbol`, for a module targeting `sm`, and
/// the splice that calls it at `points` of `kernels`.
fn splice_for(symbol: &str, sm: u32, kernels: &[&str], points: &[ProbePoint]) -> Splice {
    splice_of(PROBE, symbol, sm, kernels, points)
}

/// Probe `source` (eBPF assembly) compiled as `symbol` for the ABI of `points`, and the
/// splice that calls it there in `kernels`.
fn splice_of(
    source: &str,
    symbol: &str,
    sm: u32,
    kernels: &[&str],
    points: &[ProbePoint],
) -> Splice {
    let opts = PtxOptions {
        sm: sm.max(70),
        ptx_version: PtxVersion::DEFAULT,
        symbol: symbol.to_string(),
        kernel: false,
        probe_abi: bpftime_gpu_probe::probe_abi(points[0]),
        ..PtxOptions::default()
    };
    let program = compile(&assemble(source).unwrap(), &StandardGpuEnv, &opts).expect("compiles");
    assert!(
        !program.ptx.contains(".entry"),
        "no kernel asked for:\n{}",
        program.ptx
    );
    Splice {
        definitions: bpftime_gpu_ptx::ptx::strip_header(&program.ptx),
        needs_version: Some(Version::new(7, 8)),
        needs_sm: Some(opts.sm),
        calls: kernels
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    points
                        .iter()
                        .map(|&point| ProbeCall {
                            point,
                            symbol: symbol.to_string(),
                        })
                        .collect(),
                )
            })
            .collect(),
        inline: false,
    }
}

#[test]
fn nvcc_default_fatbin_has_zstd_ptx_and_a_cubin() {
    let bytes = read("kernels.fatbin");
    let entries = fatbin::parse(&bytes).expect("parses");
    let kinds: Vec<(EntryKind, u32)> = entries.iter().map(|e| (e.kind, e.arch)).collect();
    assert!(kinds.contains(&(EntryKind::Ptx, 75)), "{kinds:?}");
    assert!(kinds.contains(&(EntryKind::Cubin, 75)), "{kinds:?}");
    let ptx = fatbin::select_ptx(&entries, 90).expect("PTX for sm_90");
    assert_ne!(
        ptx.flags & FLAG_ZSTD,
        0,
        "nvcc 13 compresses PTX by default"
    );
    assert_eq!(ptx.ptx_version, (9, 0));
    let text = ptx.ptx_text().expect("decompresses");
    assert_eq!(
        text.len() as u64 + 1,
        ptx.decompressed_size,
        "the text and its NUL"
    );
    let module = PtxModule::parse(&text).expect("PTX parses");
    assert_eq!(module.version, Version::new(9, 0));
    assert_eq!(module.sm, Some(75));
    let names: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "_Z9vectorAddPKfS0_Pfi",
            "_Z6scaledPf5Scaleshx",
            "_ZN5tiles6matmulILi16EEEvPKfS2_Pfi"
        ]
    );
    // Through a driver-style image: the bytes classify as a fatbin and give the same PTX.
    let image = Image::from_bytes(&bytes).expect("classifies");
    let (from_image, arch) = image.ptx_for(90).unwrap().expect("PTX");
    assert_eq!((from_image.as_str(), arch), (text.as_str(), 75));
    // An sm_70 device cannot take compute_75 PTX.
    assert_eq!(image.ptx_for(70).unwrap(), None);
}

#[test]
fn multi_arch_fatbin_gives_the_newest_ptx_a_device_can_take() {
    let bytes = read("kernels-multi.fatbin");
    let entries = fatbin::parse(&bytes).expect("parses");
    assert!(
        entries.iter().all(|e| e.flags & FLAG_ZSTD == 0),
        "--no-compress"
    );
    let archs = |sm| fatbin::select_ptx(&entries, sm).map(|e| e.arch);
    assert_eq!(archs(90), Some(90));
    assert_eq!(archs(100), Some(90));
    assert_eq!(archs(89), Some(80));
    assert_eq!(archs(80), Some(80));
    assert_eq!(archs(75), None);
    let text = fatbin::select_ptx(&entries, 90)
        .unwrap()
        .ptx_text()
        .unwrap();
    assert_eq!(PtxModule::parse(&text).unwrap().sm, Some(90));
    assert!(entries
        .iter()
        .any(|e| e.kind == EntryKind::Cubin && e.arch == 80));
}

#[test]
fn images_classify_from_pointers_as_the_driver_gets_them() {
    let bytes = read("kernels.fatbin");
    // A wrapper as nvcc lays it out in .nvFatBinSegment: magic, version, data, unused.
    let mut wrapper = Vec::new();
    wrapper.extend_from_slice(&fatbin::WRAPPER_MAGIC.to_le_bytes());
    wrapper.extend_from_slice(&1u32.to_le_bytes());
    wrapper.extend_from_slice(&(bytes.as_ptr() as u64).to_le_bytes());
    wrapper.extend_from_slice(&0u64.to_le_bytes());
    // SAFETY: the wrapper points at a whole fatbin held by `bytes`.
    let image = unsafe { Image::from_ptr(wrapper.as_ptr()) }.expect("wrapper");
    assert_eq!(image, Image::Fatbin(bytes.clone()));
    // SAFETY: a whole fatbin.
    assert_eq!(
        unsafe { Image::from_ptr(bytes.as_ptr()) }.unwrap(),
        Image::Fatbin(bytes.clone())
    );
    let mut ptx = read("kernels.ptx");
    ptx.push(0);
    // SAFETY: NUL-terminated PTX.
    match unsafe { Image::from_ptr(ptx.as_ptr()) }.unwrap() {
        Image::Ptx(text) => assert!(text.contains(".entry _Z9vectorAddPKfS0_Pfi")),
        other => panic!("not PTX: {other:?}"),
    }
    let junk = b"definitely not a module\0";
    // SAFETY: NUL-terminated bytes.
    let err = unsafe { Image::from_ptr(junk.as_ptr()) }.expect_err("junk");
    assert!(matches!(err, FatbinError::UnknownImage(_)), "{err}");
}

#[test]
fn truncated_or_corrupt_fatbins_are_errors_not_panics() {
    let bytes = read("kernels.fatbin");
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        // Only trailing zero padding may be dropped without an error.
        if let Ok(entries) = fatbin::parse(cut) {
            assert!(
                cut.iter().all(|&b| b == 0) || entries.len() == 2,
                "a fatbin cut at {len} parsed as {} entries",
                entries.len()
            );
        }
    }
    let mut corrupt = bytes.clone();
    corrupt[0] ^= 0xff;
    assert!(matches!(
        fatbin::parse(&corrupt),
        Err(FatbinError::BadMagic { .. })
    ));
    // A flipped byte inside the compressed PTX fails to decompress, with the reason.
    let entries = fatbin::parse(&bytes).unwrap();
    let ptx = fatbin::select_ptx(&entries, 90).unwrap();
    let offset = ptx.payload.as_ptr() as usize - bytes.as_ptr() as usize;
    let mut damaged = bytes.clone();
    for b in &mut damaged[offset + 20..offset + 60] {
        *b ^= 0x5a;
    }
    let entries = fatbin::parse(&damaged).unwrap();
    let err = fatbin::select_ptx(&entries, 90)
        .unwrap()
        .ptx_text()
        .expect_err("damaged ZSTD");
    assert!(err.to_string().contains("does not decompress"), "{err}");
}

#[test]
fn parameters_are_read_with_their_types() {
    let text = String::from_utf8(read("kernels.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let scaled = module.kernel("_Z6scaledPf5Scaleshx").expect("scaled");
    let types: Vec<&ParamType> = scaled.params.iter().map(|p| &p.ty).collect();
    assert_eq!(
        types,
        [
            &ParamType::Scalar {
                class: 'u',
                bits: 64
            },
            &ParamType::Bytes { align: 8, len: 16 },
            &ParamType::Scalar {
                class: 'u',
                bits: 16
            },
            &ParamType::Scalar {
                class: 'u',
                bits: 8
            },
            &ParamType::Scalar {
                class: 'u',
                bits: 64
            },
        ]
    );
    assert_eq!(scaled.params[1].name, "_Z6scaledPf5Scaleshx_param_1");
    let exits = PtxModule::parse(&String::from_utf8(read("exits.ptx")).unwrap()).unwrap();
    let k = exits.kernel("exits").unwrap();
    assert_eq!(
        k.params[1].ty,
        ParamType::Scalar {
            class: 's',
            bits: 32
        }
    );
    assert_eq!(
        k.params[2].ty,
        ParamType::Scalar {
            class: 's',
            bits: 8
        }
    );
    // `@%p1 ret`, `exit`, `@!%p3 ret.uni` in a nested block, the last `ret`; not the
    // `ret` of the device function `twice`.
    assert_eq!(k.exit_count(), 4);
}

#[test]
fn every_nvcc_kernel_spliced_at_entry_and_exit_passes_ptxas() {
    for fatbin_name in ["kernels.fatbin", "kernels-multi.fatbin"] {
        let bytes = read(fatbin_name);
        let (text, _) = Image::from_bytes(&bytes)
            .unwrap()
            .ptx_for(90)
            .unwrap()
            .expect("PTX");
        let module = PtxModule::parse(&text).unwrap();
        let kernels: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
        let splice = splice_for(
            "__bpftime_probe_1",
            module.sm.unwrap(),
            &kernels,
            &[ProbePoint::Entry, ProbePoint::Exit],
        );
        let out = module
            .splice(&splice, Version::newest_for_driver(13000))
            .expect("splices");
        // The module keeps its own (newer) version and gains one call per point.
        assert!(out.contains(".version 9.0"), "{out}");
        assert_eq!(out.matches("call (__bt_ret), __bpftime_probe_1").count(), 6);
        // Every call stores its own arguments.
        assert_eq!(
            out.matches("st.param.b64 [__bt_a3], %__bta3;").count(),
            6,
            "{out}"
        );
        assert!(out.contains(".maxntid 128, 1, 1") && out.contains(".minnctapersm 2"));
        // The struct parameter goes in as an address, the others as values.
        assert!(out.contains("cvta.param.u64"), "{out}");
        // The same text each time (the driver's JIT cache keys on it).
        let again = PtxModule::parse(&text)
            .unwrap()
            .splice(&splice, Version::newest_for_driver(13000))
            .unwrap();
        assert_eq!(again, out);
        assert_ptxas_accepts(fatbin_name.trim_end_matches(".fatbin"), &out);
    }
}

#[test]
fn module_variables_are_found_with_their_space_and_use() {
    let text = String::from_utf8(read("module_vars.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let found: Vec<(&str, bool, bool)> = module
        .variables
        .iter()
        .map(|v| (v.name.as_str(), v.constant, v.used))
        .collect();
    assert_eq!(
        found,
        [
            ("scale", true, true),
            ("offsets", false, true),
            ("counted", false, true)
        ]
    );
    // Declarations of another module's, functions and kernels are not variables; one
    // no body names is not used; an initializer's values are not names.
    let text = ".version 8.0\n.target sm_90\n.address_size 64\n\
        .extern .global .align 4 .u32 elsewhere;\n\
        .global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n\
        .visible .const .align 8 .u64 unused_c;\n\
        .func (.param .b32 r) helper(.param .b32 a)\n{\n\t.reg .b32 %r<2>;\n\
        \tld.global.u32 %r1, [table];\n\tst.param.b32 [r], %r1;\n\tret;\n}\n\
        .visible .entry k()\n{\n\tret;\n}\n";
    let module = PtxModule::parse(text).unwrap();
    let found: Vec<(&str, bool, bool)> = module
        .variables
        .iter()
        .map(|v| (v.name.as_str(), v.constant, v.used))
        .collect();
    assert_eq!(found, [("table", false, true), ("unused_c", true, false)]);
}

#[test]
fn predicated_labelled_and_nested_exits_all_call_the_exit_probe() {
    let text = String::from_utf8(read("exits.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let splice = splice_for("__bpftime_probe_2", 80, &["exits"], &[ProbePoint::Exit]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_2").count(),
        4,
        "{out}"
    );
    // Predicated exits call under the same predicate, then exit under it.
    assert!(
        out.contains("@%p1 call (__bt_ret), __bpftime_probe_2"),
        "{out}"
    );
    assert!(out.contains("@%p1 ret;"), "{out}");
    assert!(
        out.contains("@!%p3 call (__bt_ret), __bpftime_probe_2"),
        "{out}"
    );
    assert!(out.contains("@!%p3 ret.uni;"), "{out}");
    // The label still leads to the probe and the exit.
    let five = out.find("$L_five:").unwrap();
    let probe_after = out[five..].find("__bpftime_probe_2").unwrap();
    let ret_after = out[five..].find("\nret;").unwrap();
    assert!(probe_after < ret_after, "{}", &out[five..]);
    // Directives kept; the module's 8.0 already covers the probe's 7.8.
    assert!(out.contains(".reqntid 64, 1, 1") && out.contains(".maxnreg 40"));
    assert!(out.contains(".version 8.0"), "{out}");
    assert_ptxas_accepts("exits", &out);
}

/// A register cap (what a session asks for when a probe's out-of-line call raised a
/// kernel's registers) goes before the named kernel's body, and only there; a kernel
/// with a `.maxnreg` of its own keeps it; ptxas takes the result.
#[test]
fn register_caps_go_on_the_named_kernels_and_spare_their_own_limits() {
    let module = nvcc_module();
    let vector_add = "_Z9vectorAddPKfS0_Pfi";
    assert_eq!(kernel_named(&module, vector_add).maxnreg, None);
    let capped = module
        .with_register_caps(&[(vector_add.to_string(), 40)])
        .unwrap();
    let again = PtxModule::parse(&capped).unwrap();
    for k in &again.kernels {
        let want = (k.name == vector_add).then_some(40);
        assert_eq!(k.maxnreg, want, "{}", k.name);
    }
    assert_eq!(capped.matches(".maxnreg").count(), 1, "{capped}");
    assert_ptxas_accepts("register-cap", &capped);

    let own = PtxModule::parse(&String::from_utf8(read("exits.ptx")).unwrap()).unwrap();
    assert_eq!(kernel_named(&own, "exits").maxnreg, Some(40));
    let kept = own
        .with_register_caps(&[("exits".to_string(), 32)])
        .unwrap();
    assert_eq!(kept.matches(".maxnreg").count(), 1, "{kept}");
    assert!(matches!(
        own.with_register_caps(&[("nowhere".to_string(), 32)]),
        Err(PtxError::NoSuchKernel(_))
    ));
}

#[test]
fn splicing_refuses_what_the_driver_would() {
    let text = String::from_utf8(read("exits.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let mut splice = splice_for("__bpftime_probe_3", 80, &["exits"], &[ProbePoint::Entry]);
    splice.needs_version = Some(Version::new(9, 1));
    let err = module
        .splice(&splice, Version::newest_for_driver(13000))
        .expect_err("9.1 is past CUDA 13.0's 9.0");
    assert!(
        err.to_string().contains("9.1") && err.to_string().contains("9.0"),
        "{err}"
    );
    splice.needs_version = None;
    splice.calls[0].0 = "nowhere".into();
    assert!(module.splice(&splice, Version::new(9, 0)).is_err());
    assert_eq!(Version::newest_for_driver(12040), Version::new(8, 4));
    assert_eq!(Version::newest_for_driver(13000), Version::new(9, 0));
}

/// A probe calling every helper the device runtime serves, on a hash map (id 1), an
/// array (id 2, inlined), a ring buffer (id 3) and a perf event array (id 4), so that the
/// whole runtime is compiled into it, as LLVM 19's NVPTX backend takes it, and spliced.
const EVERY_HELPER: &str = "
mov %r6, %r1
stdw [%r10-8], 7
stdw [%r10-16], 9
lddw %r1, 1
mov %r2, %r10
add %r2, -8
call 1
lddw %r1, 1
mov %r2, %r10
add %r2, -8
mov %r3, %r10
add %r3, -16
mov %r4, 0
call 2
lddw %r1, 1
mov %r2, %r10
add %r2, -8
call 3
stw [%r10-20], 1
lddw %r1, 2
mov %r2, %r10
add %r2, -20
call 1
lddw %r1, 3
mov %r2, %r10
add %r2, -16
mov %r3, 8
mov %r4, 0
call 130
mov %r1, %r6
lddw %r2, 4
lddw %r3, 0xffffffff
mov %r4, %r10
add %r4, -16
mov %r5, 8
call 25
mov %r1, %r10
add %r1, -16
mov %r2, 8
mov %r3, 1
call 6
mov %r1, %r10
add %r1, -8
mov %r2, 8
ldxdw %r3, [%r6+112]
call 4
mov %r1, %r10
add %r1, -8
mov %r2, 8
ldxdw %r3, [%r6+104]
call 45
mov %r1, %r10
add %r1, -16
call 501
call 14
call 7
call 5
exit
";

#[test]
fn a_probe_using_the_whole_device_runtime_compiles_and_splices() {
    use bpftime_gpu_device::device_maps::RuntimeConfig;
    use bpftime_gpu_probe::{compile_probe, DeviceMapRef};
    use bpftime_jit_ptx::ArrayMapLayout;
    let mut insns = assemble(EVERY_HELPER).expect("assembles");
    // The small `lddw` immediates are store map ids, as the shim leaves them.
    for insn in insns.iter_mut() {
        if insn.is_lddw() && (1..=4).contains(&insn.imm) {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    let base = 0x7f00_0000_0000u64;
    let maps = (1..=4u32)
        .map(|id| {
            let desc = base + id as u64 * 0x1000;
            let array = (id == 2).then_some(ArrayMapLayout {
                values: desc + 0x100,
                key_stride: 8,
                max_entries: 4,
                update_size: 8,
                per_cpu: None,
            });
            (
                id,
                DeviceMapRef {
                    desc,
                    values: array.map(|a| a.values),
                    array,
                },
            )
        })
        .collect();
    let config = RuntimeConfig {
        pid_tgid_at: base + 0x8000,
        trace_ring: base + 0x9000,
        shards: vec![],
    };
    for sm in [75, 90] {
        let program = compile_probe(
            ProbePoint::Entry,
            &insns,
            &maps,
            &config,
            sm,
            "__bpftime_probe_9",
        )
        .unwrap_or_else(|e| panic!("sm_{sm}: {e}"));
        assert!(program.externs.is_empty(), "{:?}", program.externs);
        // The hash map's slots are claimed with a compare-and-swap, counters added
        // atomically, and the array lookup inlined to its device address.
        assert!(
            program.ptx.contains("atom") && program.ptx.contains(".cas"),
            "{}",
            program.ptx
        );
        let text = String::from_utf8(read("kernels.ptx")).unwrap();
        let module = PtxModule::parse(&text).unwrap();
        let splice = Splice {
            definitions: bpftime_gpu_ptx::ptx::strip_header(&program.ptx),
            needs_version: Some(Version::new(7, 8)),
            needs_sm: Some(sm),
            calls: vec![(
                "_Z9vectorAddPKfS0_Pfi".to_string(),
                vec![
                    ProbeCall {
                        point: ProbePoint::Entry,
                        symbol: "__bpftime_probe_9".into(),
                    },
                    ProbeCall {
                        point: ProbePoint::Exit,
                        symbol: "__bpftime_probe_9".into(),
                    },
                ],
            )],
            inline: false,
        };
        let out = module
            .splice(&splice, Version::newest_for_driver(13000))
            .unwrap();
        assert_ptxas_accepts(&format!("every-helper-sm{sm}"), &out);
        // The same probe put in place of its calls: maps, helpers, the stack and the
        // runtime's out-of-line functions, at entry and before the exit.
        let inlined = Splice {
            inline: true,
            ..splice
        };
        let out = module
            .splice(&inlined, Version::newest_for_driver(13000))
            .unwrap();
        assert!(!out.contains("call (__bt_ret), __bpftime_probe_9"), "{out}");
        assert_eq!(out.matches("$__bti1_end:").count(), 1, "{out}");
        assert_ptxas_accepts(&format!("every-helper-inlined-sm{sm}"), &out);
    }
}

/// Map id 2 as an array of `max_entries` 8-byte values at a made-up device address, as
/// a probe's relocated `lddw` sees it.
fn one_array_map(
    max_entries: u32,
) -> (
    bpftime_jit_ptx::ArrayMapLayout,
    std::collections::HashMap<u32, bpftime_gpu_probe::DeviceMapRef>,
) {
    let desc = 0x7f00_0000_2000u64;
    let array = bpftime_jit_ptx::ArrayMapLayout {
        values: desc + 0x100,
        key_stride: 8,
        max_entries,
        update_size: 8,
        per_cpu: None,
    };
    let map = bpftime_gpu_probe::DeviceMapRef {
        desc,
        values: Some(array.values),
        array: Some(array),
    };
    (array, [(2u32, map)].into_iter().collect())
}

#[test]
fn a_counter_on_every_thread_adds_once_per_warp() {
    use bpftime_gpu_device::device_maps::RuntimeConfig;
    use bpftime_gpu_probe::compile_probe;
    // A non-fetching add on an array value, then one on the stack (which must stay
    // plain: the GPU has no atomics on local memory).
    let mut insns = assemble(
        "stw [%r10-4], 0\nlddw %r1, 2\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, +7\n\
         mov %r1, 1\nlock add [%r0+0], %r1\nstdw [%r10-16], 0\nmov %r3, %r10\nadd %r3, -16\n\
         lock add [%r3+0], %r1\nldxdw %r0, [%r10-16]\nexit\nmov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && insn.imm == 2 {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    let (array, maps) = one_array_map(1);
    // Unsharded, then with the array sharded per SM: the one atomic then goes to the
    // SM's copy, found by comparing with constants (no table in memory).
    let shard = bpftime_gpu_device::device_maps::ShardEntry {
        base: array.values,
        len: 8,
        shards64: 0x7f00_0010_0000,
        shards32: 0x7f00_0010_0000 + 256 * 132,
        stride: 256,
        copies: 132,
    };
    let sharded = RuntimeConfig {
        shards: vec![shard],
        ..RuntimeConfig::default()
    };
    let plain = compile_probe(
        ProbePoint::Entry,
        &insns,
        &maps,
        &RuntimeConfig::default(),
        90,
        "__bpftime_probe_5",
    )
    .expect("compiles");
    assert!(!plain.ptx.contains("%smid"), "{}", plain.ptx);
    let p = compile_probe(
        ProbePoint::Entry,
        &insns,
        &maps,
        &sharded,
        90,
        "__bpftime_probe_5",
    )
    .expect("compiles");
    assert!(p.ptx.contains("%smid"), "{}", p.ptx);
    assert!(p.ptx.contains(&shard.shards64.to_string()), "{}", p.ptx);
    for p in [&plain, &p] {
        // The counter's add is the one atomic; the stack's stays a plain store.
        assert_eq!(
            p.ptx.matches("atom.").count() + p.ptx.matches("red.").count(),
            1,
            "{}",
            p.ptx
        );
    }
    assert_ptxas_accepts(
        "warp-add",
        &splice_into_vector_add(&p.ptx, "__bpftime_probe_5", false),
    );
}

/// `ptx`'s probe `symbol` spliced at vectorAdd's entry (kernels.ptx), called or inlined.
fn splice_into_vector_add(ptx: &str, symbol: &str, inline: bool) -> String {
    let text = String::from_utf8(read("kernels.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let splice = Splice {
        definitions: bpftime_gpu_ptx::ptx::strip_header(ptx),
        needs_version: Some(Version::new(7, 8)),
        needs_sm: Some(90),
        calls: vec![(
            "_Z9vectorAddPKfS0_Pfi".to_string(),
            vec![ProbeCall {
                point: ProbePoint::Entry,
                symbol: symbol.into(),
            }],
        )],
        inline,
    };
    module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap()
}

/// A counter of a constant at a constant address (an array value with a constant key)
/// is the commonest probe: its warp add folds to one atomic by the first active lane, of
/// the constant times the active lanes, with no match and no shuffles. A sum of a value
/// that differs by thread keeps its shuffles.
#[test]
fn a_constant_counter_needs_no_warp_shuffles() {
    use bpftime_gpu_device::device_maps::RuntimeConfig;
    use bpftime_gpu_probe::compile_probe;
    let (_, maps) = one_array_map(2);
    let compile = |add: &str| {
        let mut insns = assemble(&format!(
            "stw [%r10-4], 0\nlddw %r1, 2\nmov %r2, %r10\nadd %r2, -4\ncall 1\n\
             jeq %r0, 0, +3\nmov %r6, %r0\n{add}\nexit\nmov %r0, 0\nexit"
        ))
        .expect("assembles");
        for insn in insns.iter_mut() {
            if insn.is_lddw() && insn.imm == 2 {
                insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
            }
        }
        compile_probe(
            ProbePoint::Entry,
            &insns,
            &maps,
            &RuntimeConfig::default(),
            90,
            "__bpftime_probe_7",
        )
        .expect("compiles")
        .ptx
    };
    let count = compile("mov %r1, 1\nlock add [%r6+0], %r1\nmov %r0, 0");
    assert!(!count.contains("match.any"), "{count}");
    assert!(!count.contains("shfl"), "{count}");
    // The first active lane adds the constant times the active lanes.
    assert!(
        count.contains("%laneid") && count.contains("activemask") && count.contains("popc.b32"),
        "{count}"
    );
    assert_eq!(
        count.matches("atom.").count() + count.matches("red.").count(),
        1
    );
    let sum = compile("call 5\nlock add [%r6+0], %r0\nmov %r0, 0");
    assert!(!sum.contains("match.any"), "{sum}");
    assert!(sum.contains("shfl.sync.bfly"), "{sum}");
}

/// A histogram's add: an array value picked by an index the probe computes, in one of two
/// arrays picked by another (memtrace's offset histograms). The value is device memory
/// whatever the index, so the add needs no test for the stack; and with the arrays in
/// the context's shard window, its SM's copy is one range check away, not a compare per
/// array.
#[test]
fn a_histogram_add_at_a_computed_index_goes_straight_to_its_sms_copy() {
    use bpftime_gpu_device::device_maps::{RuntimeConfig, ShardEntry, SHARD_WINDOW_SPAN};
    use bpftime_gpu_probe::{compile_probe, DeviceMapRef};
    let mut insns = assemble(
        "ldxdw %r2, [%r1+112]\nmov %r3, %r2\nand %r2, 63\nstxw [%r10-4], %r2\n\
         mov %r2, %r10\nadd %r2, -4\njset %r3, 64, +4\nlddw %r1, 2\ncall 1\nja +3\n\
         lddw %r1, 3\ncall 1\njeq %r0, 0, +2\nmov %r1, 1\nlock add [%r0+0], %r1\n\
         mov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && (2..=3).contains(&insn.imm) {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    let window = 0x3000_0010_0000u64;
    let mut maps = std::collections::HashMap::new();
    let mut shards = vec![];
    for (id, at) in [(2u32, 0u64), (3, 512)] {
        let values = window + at;
        let array = bpftime_jit_ptx::ArrayMapLayout {
            values,
            key_stride: 8,
            max_entries: 64,
            update_size: 8,
            per_cpu: None,
        };
        maps.insert(
            id,
            DeviceMapRef {
                desc: 0x3000_0000_1000 + u64::from(id) * 0x100,
                values: Some(values),
                array: Some(array),
            },
        );
        shards.push(ShardEntry::in_window(values, 512, 256));
    }
    let config = RuntimeConfig {
        shards,
        ..RuntimeConfig::default()
    };
    let p = compile_probe(
        ProbePoint::Entry,
        &insns,
        &maps,
        &config,
        90,
        "__bpftime_probe_8",
    )
    .expect("compiles");
    assert!(!p.ptx.contains("isspacep"), "{}", p.ptx);
    assert!(p.ptx.contains("%smid"), "{}", p.ptx);
    // SM k's copy is `SPAN * (1 + k)` past the value, which is in the window whichever
    // array it is in: no address is compared with anything.
    assert!(
        p.ptx.contains(&format!("{}", SHARD_WINDOW_SPAN)),
        "{}",
        p.ptx
    );
    for compare in ["setp.lt.u64", "setp.gt.u64", "setp.le.u64", "setp.ge.u64"] {
        assert!(!p.ptx.contains(compare), "{}", p.ptx);
    }
    assert_ptxas_accepts(
        "histogram-add",
        &splice_into_vector_add(&p.ptx, "__bpftime_probe_8", true),
    );
}

#[test]
fn two_probes_at_one_point_each_get_their_own_arguments() {
    let text = String::from_utf8(read("kernels.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let mut splice = splice_for(
        "__bpftime_probe_6",
        module.sm.unwrap(),
        &["_Z9vectorAddPKfS0_Pfi"],
        &[ProbePoint::Entry, ProbePoint::Entry],
    );
    splice.calls[0].1.truncate(2);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(out.matches("call (__bt_ret), __bpftime_probe_6").count(), 2);
    // A callee may reuse the space of its arguments: the second call stores them again.
    assert_eq!(
        out.matches("st.param.b64 [__bt_a3], %__bta3;").count(),
        2,
        "{out}"
    );
    assert_ptxas_accepts("two-probes", &out);
}

/// An access probe reading the whole of its context: the kernel's arguments, the address,
/// the value, size, kind, kernel id and site, summed so nothing is optimized away.
const ACCESS_PROBE: &str = "
ldxdw %r2, [%r1+112]
ldxdw %r3, [%r1+64]
add %r2, %r3
ldxdw %r3, [%r1+0]
add %r2, %r3
ldxdw %r3, [%r1+8]
add %r2, %r3
ldxdw %r3, [%r1+16]
add %r2, %r3
ldxw %r3, [%r1+24]
add %r2, %r3
ldxw %r3, [%r1+28]
add %r2, %r3
ldxw %r3, [%r1+32]
add %r2, %r3
ldxw %r3, [%r1+36]
add %r2, %r3
mov %r0, %r2
exit
";

fn access_splice(symbol: &str, sm: u32, kernels: &[&str]) -> Splice {
    splice_of(ACCESS_PROBE, symbol, sm, kernels, &[ProbePoint::Access])
}

/// Each access says which kernel parameter its address is computed from: vectorAdd's and
/// the tiled matmul's loads of `a` and `b` and stores to `c` (the matmul's through a
/// pointer its loop advances); `scaled`'s accesses all go through `out`. A shared-memory
/// access is in no parameter's buffer. The spliced calls pass it in the context's `bx`
/// slot, -1 where there is none.
#[test]
fn accesses_know_the_kernel_parameter_their_buffer_came_from() {
    let module = nvcc_module();
    let kernel = |name: &str| kernel_named(&module, name);
    for name in ["vectorAdd", "matmul"] {
        let k = kernel(name);
        let mut by_kind: Vec<(AccessKind, Option<usize>)> = k
            .access_sizes(ProbePoint::Access)
            .iter()
            .map(|a| a.0)
            .zip(k.access_base_args(ProbePoint::Access))
            .collect();
        by_kind.sort_by_key(|&(kind, arg)| (kind as u32, arg));
        assert_eq!(
            by_kind,
            vec![
                (AccessKind::Load, Some(0)),
                (AccessKind::Load, Some(1)),
                (AccessKind::Store, Some(2))
            ],
            "{name}"
        );
    }
    let scaled = kernel("scaled").access_base_args(ProbePoint::Access);
    assert!(!scaled.is_empty());
    assert!(scaled.iter().all(|&a| a == Some(0)), "{scaled:?}");
    let shared = kernel("matmul").access_base_args(ProbePoint::SharedAccess);
    assert!(shared.contains(&None), "{shared:?}");
    assert_eq!(shared.iter().flatten().count(), 3, "{shared:?}");
    let splice = access_splice(
        "__bpftime_probe_7",
        module.sm.unwrap(),
        &["_Z9vectorAddPKfS0_Pfi"],
    );
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    let passed: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mov.u64 %__bta11, "))
        .collect();
    let expected: Vec<String> = kernel("vectorAdd")
        .access_base_args(ProbePoint::Access)
        .iter()
        .map(|a| format!("{};", a.unwrap()))
        .collect();
    assert_eq!(passed, expected, "{out}");

    // A pointer read from memory, or two parameters added, has no one base argument.
    let text = "
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1)
{
.reg .b64 %rd<8>;
.reg .f32 %f<2>;
ld.param.u64 %rd1, [k_param_0];
ld.param.u64 %rd2, [k_param_1];
cvta.to.global.u64 %rd3, %rd1;
ld.global.u64 %rd4, [%rd3];
ld.global.f32 %f1, [%rd4];
add.s64 %rd5, %rd1, %rd2;
st.global.f32 [%rd5], %f1;
st.global.f32 [%rd3+8], %f1;
ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    assert_eq!(
        module.kernels[0].access_base_args(ProbePoint::Access),
        vec![Some(0), None, None, Some(0)]
    );
}

#[test]
fn nvcc_kernels_probed_at_every_global_access_pass_ptxas() {
    let module = nvcc_module();
    let kernel = |name: &str| kernel_named(&module, name);
    // vectorAdd reads a[i] and b[i] and writes c[i]; the tiled matmul reads one element
    // of a and one of b per tile step (its shared-memory traffic is left out) and
    // writes c once.
    use SiteSpace::*;
    for name in ["vectorAdd", "matmul"] {
        let k = kernel(name);
        assert_eq!(
            k.access_sizes(ProbePoint::Access),
            vec![
                (AccessKind::Load, 4, Global),
                (AccessKind::Load, 4, Global),
                (AccessKind::Store, 4, Global)
            ],
            "{name}"
        );
        assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    }
    let kernels: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
    let expected: usize = module
        .kernels
        .iter()
        .map(|k| {
            k.access_counts(ProbePoint::Access)
                .iter()
                .map(|c| c.1)
                .sum::<usize>()
        })
        .sum();
    let splice = access_splice("__bpftime_probe_7", module.sm.unwrap(), &kernels);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_7").count(),
        expected,
        "{out}"
    );
    assert_eq!(
        out.matches("st.param.b64 [__bt_a10], %__bta10;").count(),
        expected
    );
    assert_ptxas_accepts("nvcc-accesses", &out);
}

#[test]
fn every_form_of_global_access_is_probed_and_other_spaces_are_not() {
    let text = String::from_utf8(read("accesses.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let k = module.kernel("accesses").unwrap();
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![
            (Load, 16, Global),
            (Load, 4, Global),
            (Store, 16, Global),
            (Atomic, 4, Global),
            (Atomic, 8, Global),
            (Reduction, 4, Global),
            (Store, 1, Global),
            (Store, 4, Global),
            (Load, 4, Global),
            (Load, 4, Generic),
            (Store, 4, Generic),
            (Load, 8, Global),
        ]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    let splice = access_splice("__bpftime_probe_8", 80, &["accesses"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_8").count(),
        12
    );
    let id = bpftime_gpu_ptx::ptx::kernel_id("accesses") as u64;
    // Size and kind, kernel id and site, as immediates.
    assert!(
        out.contains(&format!("mov.u64 %__bta9, {};", 16 | 1u64 << 32)),
        "{out}"
    );
    assert!(
        out.contains(&format!("mov.u64 %__bta10, {};", id | 10u64 << 32)),
        "{out}"
    );
    // A predicated access calls under its predicate; generic ones where the address is
    // global, and under their own predicate too.
    assert!(
        out.contains("@!%p1 call (__bt_ret), __bpftime_probe_8"),
        "{out}"
    );
    assert!(out.contains("isspacep.global %__btp, %__bta6;"), "{out}");
    assert!(out.contains("and.pred %__btp, %__btp, %p1;"), "{out}");
    assert!(
        out.contains("@%__btp call (__bt_ret), __bpftime_probe_8"),
        "{out}"
    );
    // Addresses: a register plus a negative offset, a variable made generic.
    assert!(out.contains("add.s64 %__bta6, %__bta6, -16;"), "{out}");
    assert!(out.contains("mov.u64 %__bta6, counter;\ncvta.global.u64 %__bta6, %__bta6;"));
    // Values: the CAS's new value, the byte store masked, the immediate as is, the
    // 16-byte store's second lane in the high half.
    assert!(
        out.contains("mov.b64 %__btv, %rd4;\nor.b64 %__bta8, %__bta8, %__btv;"),
        "{out}"
    );
    assert!(out.contains("and.b64 %__btv, %__btv, 255;"), "{out}");
    assert!(out.contains("mov.u64 %__btv, 42;"), "{out}");
    assert!(out.contains("mov.u64 %__btv, 1065353216;"), "{out}");
    // A probe follows its access, so the access is issued first, and the next load of
    // the same straight run too, so both are in flight while the probes run: the label
    // leads to the load, then the generic load, then the first's probe and the
    // second's, in that order, before the store (which no call is moved past).
    let label = out.find("$L_again:").unwrap();
    let load = label + out[label..].find("ld.global.u32 %r4").unwrap();
    let next = load + out[load..].find("ld.u32 %r5").unwrap();
    let first = load + out[load..].find("__bpftime_probe_8").unwrap();
    let store = load + out[load..].find("@%p1 st.f32").unwrap();
    assert!(next < first && first < store, "{}", &out[label..]);
    let probes: Vec<&str> = out[next..store]
        .lines()
        .filter(|l| l.starts_with("mov.u64 %__bta10,"))
        .collect();
    assert_eq!(
        probes,
        vec![
            // Sites 9 and 10 of the comments, numbered from 0.
            format!("mov.u64 %__bta10, {};", id | 8u64 << 32),
            format!("mov.u64 %__bta10, {};", id | 9u64 << 32)
        ],
        "{}",
        &out[label..]
    );
    // Also an atomic that returns a value into a register of its own.
    let atomic = out.find("atom.global.add.u32 %r3, [%rd3], %r2;").unwrap();
    let cas = out.find("atom.global.cas.b64").unwrap();
    assert!(out[atomic..cas].contains("__bpftime_probe_8"), "{out}");
    // A load that overwrites its address register is probed before it.
    let chase = out.find("ld.global.u64 %rd4, [%rd4+8];").unwrap();
    let before = out[..chase].rfind("ld.param").unwrap();
    assert!(
        out[before..chase].contains("call (__bt_ret), __bpftime_probe_8"),
        "{}",
        &out[before..]
    );
    assert!(
        !out[chase..].contains("__bpftime_probe_8"),
        "{}",
        &out[chase..]
    );
    assert_ptxas_accepts("accesses", &out);
}

#[test]
fn probes_put_in_place_of_their_calls_pass_ptxas_everywhere_a_call_goes() {
    // Every kind of site: predicated and labelled exits, vector, atomic, generic and
    // predicated accesses, nvcc's kernels with struct and sub-word parameters.
    let exits = PtxModule::parse(&String::from_utf8(read("exits.ptx")).unwrap()).unwrap();
    let mut splice = splice_for("__bpftime_probe_11", 80, &["exits"], &[ProbePoint::Exit]);
    splice.inline = true;
    let out = exits
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert!(!out.contains("call (__bt_ret)"), "{out}");
    assert_eq!(out.matches("_end:\n}").count(), 4, "{out}");
    // A predicated exit skips the body where its predicate is false.
    assert!(out.contains("@!%p1 bra $__bti"), "{out}");
    assert_ptxas_accepts("exits-inlined", &out);

    let accesses = PtxModule::parse(&String::from_utf8(read("accesses.ptx")).unwrap()).unwrap();
    let mut splice = access_splice("__bpftime_probe_12", 80, &["accesses"]);
    splice.inline = true;
    let out = accesses
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert!(!out.contains("call (__bt_ret)"), "{out}");
    assert_eq!(out.matches("_end:\n}").count(), 12, "{out}");
    assert!(out.contains("@!%__btp bra $__bti"), "{out}");
    assert_ptxas_accepts("accesses-inlined", &out);

    let module = nvcc_module();
    let kernels: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut splice = splice_for(
        "__bpftime_probe_13",
        module.sm.unwrap(),
        &kernels,
        &[ProbePoint::Entry, ProbePoint::Exit],
    );
    splice.inline = true;
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert!(!out.contains("call (__bt_ret)"), "{out}");
    assert_ptxas_accepts("nvcc-inlined", &out);
}

/// percpu_hashcount's probe: a per-CPU hash map (map id 3, reached through its descriptor
/// only, as every hash is) looked up, its key inserted when missing, and its value added
/// to. The runtime picks the SM's copy of the value from the descriptor's copy count at
/// run time, so the probe reads `%smid`; inserts claim slots with a compare-and-swap.
#[test]
fn a_probe_on_a_per_cpu_hash_compiles_splices_and_passes_ptxas() {
    use bpftime_gpu_device::device_maps::RuntimeConfig;
    use bpftime_gpu_probe::{compile_probe, DeviceMapRef};
    let mut insns = assemble(
        "stw [%r10-4], 7\nstdw [%r10-16], 0\nlddw %r1, 3\nmov %r2, %r10\nadd %r2, -4\ncall 1\n\
         jne %r0, 0, +12\nlddw %r1, 3\nmov %r2, %r10\nadd %r2, -4\nmov %r3, %r10\nadd %r3, -16\n\
         mov %r4, 1\ncall 2\nlddw %r1, 3\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, +2\n\
         mov %r1, 1\nlock add [%r0+0], %r1\nmov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && insn.imm == 3 {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    let maps = [(
        3u32,
        DeviceMapRef {
            desc: 0x7f00_0000_3000,
            values: None,
            array: None,
        },
    )]
    .into_iter()
    .collect();
    for sm in [75, 90] {
        let p = compile_probe(
            ProbePoint::Entry,
            &insns,
            &maps,
            &RuntimeConfig::default(),
            sm,
            "__bpftime_probe_3",
        )
        .unwrap_or_else(|e| panic!("sm_{sm}: {e}"));
        assert!(p.externs.is_empty(), "{:?}", p.externs);
        assert!(p.ptx.contains("%smid"), "{}", p.ptx);
        assert!(p.ptx.contains(".cas"), "{}", p.ptx);
        let text = String::from_utf8(read("kernels.ptx")).unwrap();
        let module = PtxModule::parse(&text).unwrap();
        let splice = Splice {
            definitions: bpftime_gpu_ptx::ptx::strip_header(&p.ptx),
            needs_version: Some(Version::new(7, 8)),
            needs_sm: Some(sm),
            calls: vec![(
                "_Z9vectorAddPKfS0_Pfi".to_string(),
                vec![ProbeCall {
                    point: ProbePoint::Entry,
                    symbol: "__bpftime_probe_3".into(),
                }],
            )],
            inline: true,
        };
        let out = module
            .splice(&splice, Version::newest_for_driver(13000))
            .unwrap();
        assert_ptxas_accepts(&format!("percpu-hash-sm{sm}"), &out);
    }
}

fn shared_access_splice(symbol: &str, sm: u32, kernels: &[&str]) -> Splice {
    splice_of(
        ACCESS_PROBE,
        symbol,
        sm,
        kernels,
        &[ProbePoint::SharedAccess],
    )
}

/// `module` spliced by `splice` with its probes called, then inlined: each output, with
/// how many calls of `symbol` (or inlined bodies) it holds.
fn called_and_inlined(
    module: &PtxModule,
    splice: &Splice,
    symbol: &str,
) -> [(bool, String, usize); 2] {
    [false, true].map(|inline| {
        let mut splice = splice.clone();
        splice.inline = inline;
        let out = module
            .splice(&splice, Version::newest_for_driver(13000))
            .unwrap();
        let probes = if inline {
            out.matches("_end:\n}").count()
        } else {
            out.matches(&format!("call (__bt_ret), {symbol}")).count()
        };
        (inline, out, probes)
    })
}

/// The size-and-kind argument of an access, as `struct bpftime_gpu_access` reads it.
fn access_word(kind: AccessKind, size: u32, space: AccessSpace) -> u64 {
    u64::from(size) | (kind as u64) << 32 | (space as u64) << 48
}

#[test]
fn with_shared_asked_every_form_of_shared_access_is_probed_and_local_const_param_are_not() {
    let text = String::from_utf8(read("shared.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let k = module.kernel("shared_forms").unwrap();
    use AccessKind::*;
    use SiteSpace::*;
    let shared_sites = vec![
        (Store, 4, Shared),
        (Load, 4, Shared),
        (Store, 16, Shared),
        (Load, 8, Shared),
        (Atomic, 4, Shared),
        (Atomic, 8, Shared),
        (Reduction, 8, Shared),
        (Load, 4, Shared),
        (Store, 4, Shared),
        (Store, 4, Global),
        (Load, 4, Generic),
        (Store, 4, Generic),
    ];
    assert_eq!(k.access_sizes(ProbePoint::SharedAccess), shared_sites);
    // A plain `:ldst` probe still sees the global and generic ones only.
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![(Store, 4, Global), (Load, 4, Generic), (Store, 4, Generic)]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    assert!(
        k.unseen_shared_accesses.is_empty(),
        "{:?}",
        k.unseen_shared_accesses
    );
    let splice = shared_access_splice("__bpftime_probe_14", 75, &["shared_forms"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_14").count(),
        12,
        "{out}"
    );
    // Shared accesses say so in the context, global ones as a `:ldst` probe sees them.
    for (kind, size, space) in [
        (Store, 4, AccessSpace::Shared),
        (Store, 16, AccessSpace::Shared),
        (Reduction, 8, AccessSpace::Shared),
        (Store, 4, AccessSpace::Global),
    ] {
        let word = access_word(kind, size, space);
        assert!(out.contains(&format!("mov.u64 %__bta9, {word};")), "{word}");
    }
    // Window addresses are made generic: a 32-bit register, a variable with its offset
    // after, a 64-bit register, `::cta` as plain shared.
    assert!(
        out.contains("cvt.u64.u32 %__bta6, %r5;\ncvta.shared.u64 %__bta6, %__bta6;\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "mov.u64 %__bta6, tile;\ncvta.shared.u64 %__bta6, %__bta6;\nadd.s64 %__bta6, %__bta6, 16;"
        ),
        "{out}"
    );
    assert!(
        out.contains("mov.b64 %__bta6, %rd2;\ncvta.shared.u64 %__bta6, %__bta6;\nadd.s64 %__bta6, %__bta6, 32;"),
        "{out}"
    );
    assert!(out.contains("add.s64 %__bta6, %__bta6, -4;"), "{out}");
    assert!(!out.contains("shared::cta.u64"), "{out}");
    // Generic ones run where the address is global or shared, and say which.
    assert!(
        out.contains("isspacep.shared %__btr, %__bta6;\nor.pred %__btp, %__btp, %__btr;"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "selp.b64 %__bta9, {}, {}, %__btr;",
            access_word(Load, 4, AccessSpace::Shared),
            access_word(Load, 4, AccessSpace::Global)
        )),
        "{out}"
    );
    assert!(
        out.contains("not.pred %__btq, %p1;\nand.pred %__btp, %__btp, %__btq;"),
        "{out}"
    );
    assert!(
        out.contains("@%__btp call (__bt_ret), __bpftime_probe_14"),
        "{out}"
    );
    assert!(
        out.contains("@%p1 call (__bt_ret), __bpftime_probe_14"),
        "{out}"
    );
    // Sites are numbered among what the probe sees: the last is the 12th.
    let id = bpftime_gpu_ptx::ptx::kernel_id("shared_forms") as u64;
    assert!(
        out.contains(&format!("mov.u64 %__bta10, {};", id | 11u64 << 32)),
        "{out}"
    );
    assert!(!out.contains(&format!("mov.u64 %__bta10, {};", id | 12u64 << 32)));
    for sm in [75, 90] {
        assert_ptxas_accepts_for(&format!("shared-forms-sm{sm}"), &out, sm);
    }
    let mut inlined = splice.clone();
    inlined.inline = true;
    let out = module
        .splice(&inlined, Version::newest_for_driver(13000))
        .unwrap();
    assert!(!out.contains("call (__bt_ret)"), "{out}");
    assert_eq!(out.matches("_end:\n}").count(), 12, "{out}");
    for sm in [75, 90] {
        assert_ptxas_accepts_for(&format!("shared-forms-inlined-sm{sm}"), &out, sm);
    }
}

/// The global hand-written forms with `.shared` asked: the same global sites as `:ldst`
/// (the shared and local ones of accesses.ptx now seen, the local one still not).
#[test]
fn shared_probes_see_what_ldst_sees_and_the_shared_accesses_besides() {
    let text = String::from_utf8(read("accesses.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let k = module.kernel("accesses").unwrap();
    let global = k.access_sizes(ProbePoint::Access);
    let all = k.access_sizes(ProbePoint::SharedAccess);
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(all.len(), global.len() + 2);
    assert_eq!(&all[..global.len()], &global[..]);
    assert_eq!(
        &all[global.len()..],
        &[(Store, 4, Shared), (Load, 4, Shared)]
    );
    // Both kinds of probe on one kernel: each gets its own calls at the sites it sees.
    let mut splice = access_splice("__bpftime_probe_15", 80, &["accesses"]);
    let shared = shared_access_splice("__bpftime_probe_16", 80, &["accesses"]);
    splice.definitions.push('\n');
    splice.definitions.push_str(&shared.definitions);
    splice.calls[0].1.extend(shared.calls[0].1.iter().cloned());
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_15").count(),
        global.len()
    );
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_16").count(),
        all.len()
    );
    assert_ptxas_accepts("accesses-both", &out);
}

/// The tiled matmul nvcc compiled (TILE 16): per tile step, one global load of a and one
/// of b, two shared stores, and 2 x 16 shared loads (the inner loop unrolled); then one
/// global store. What bpf-examples/access_check counts on the GPU, site by site here.
#[test]
fn nvcc_matmul_probed_at_every_shared_access_passes_ptxas() {
    let module = nvcc_module();
    let k = kernel_named(&module, "matmul");
    use AccessKind::*;
    use SiteSpace::*;
    let sites = k.access_sizes(ProbePoint::SharedAccess);
    let count = |want: (AccessKind, u32, SiteSpace)| sites.iter().filter(|s| **s == want).count();
    assert_eq!(count((Load, 4, Global)), 2, "{sites:?}");
    assert_eq!(count((Store, 4, Global)), 1, "{sites:?}");
    assert_eq!(count((Store, 4, Shared)), 2, "{sites:?}");
    assert_eq!(count((Load, 4, Shared)), 32, "{sites:?}");
    assert_eq!(sites.len(), 37, "{sites:?}");
    assert!(
        k.unseen_shared_accesses.is_empty(),
        "{:?}",
        k.unseen_shared_accesses
    );
    let name = k.name.clone();
    let splice = shared_access_splice("__bpftime_probe_17", module.sm.unwrap(), &[&name]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_17").count(),
        37
    );
    for sm in [75, 90] {
        assert_ptxas_accepts_for(&format!("nvcc-matmul-shared-sm{sm}"), &out, sm);
    }
}

/// nvcc's vectorAdd reading a and b through asynchronous copies into shared memory
/// (bpf-examples/cuda/vec_add.cu with -DASYNC_COPY): each copy is a 4-byte load of the
/// buffer its kernel argument names, c's store a store, the copies' shared-memory writes
/// named as missed; probed (called and inlined), the module passes ptxas.
#[test]
fn nvcc_async_copies_are_loads_of_their_buffers() {
    let text = String::from_utf8(read("vec_add_async.ptx")).unwrap();
    assert_eq!(text.matches("cp.async.ca.shared.global").count(), 2);
    let module = PtxModule::parse(&text).unwrap();
    let k = kernel_named(&module, "vectorAdd");
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![(Load, 4, Global), (Load, 4, Global), (Store, 4, Global)]
    );
    assert_eq!(
        k.access_base_args(ProbePoint::Access),
        vec![Some(0), Some(1), Some(2)]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    assert_eq!(k.unseen_shared_accesses.len(), 2);
    let splice = access_splice("__bpftime_probe_20", 90, &[k.name.as_str()]);
    for (inline, out, probes) in called_and_inlined(&module, &splice, "__bpftime_probe_20") {
        assert_eq!(probes, 3, "{out}");
        assert_ptxas_accepts(&format!("vec-add-async-{inline}"), &out);
    }
}

/// An access's probe runs after the loads that follow it in the same straight run, so
/// that they are in flight together, but never after a statement that reads what one of
/// them loaded (the probe would wait for the load instead of running during it), nor
/// after one that overwrites a register the probe reads, nor past a store or a carry;
/// probes keep their accesses' order.
#[test]
fn probes_wait_for_the_next_loads_of_their_run_and_no_longer() {
    let text = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry runs(.param .u64 p)
{
	.reg .b32 %r<8>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [p];
	ld.global.u32 %r1, [%rd1];
	add.s32 %r2, %r1, 1;
	ld.global.u32 %r3, [%rd1+4];
	add.s64 %rd1, %rd1, 8;
	ld.global.u32 %r4, [%rd1];
	add.s64 %rd2, %rd1, 64;
	ld.global.u32 %r5, [%rd2];
	ld.global.u32 %r6, [%rd2+4];
	st.global.u32 [%rd1], %r2;
	ld.global.u32 %r7, [%rd2+8];
	ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    let splice = access_splice("__bpftime_probe_23", 80, &["runs"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    let id = bpftime_gpu_ptx::ptx::kernel_id("runs") as u64;
    // The body as statements and probes (by site), in order.
    let order: Vec<String> = out[out.find("ld.param.u64 %rd1, [p];").unwrap()..]
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(v) = l.strip_prefix("mov.u64 %__bta10, ") {
                let v: u64 = v.trim_end_matches(';').parse().unwrap();
                assert_eq!(v & 0xffff_ffff, id);
                return Some(format!("probe {}", v >> 32));
            }
            let app = ["ld.global", "add.", "st.global"]
                .iter()
                .any(|p| l.starts_with(p))
                && !l.contains("%__bt");
            app.then(|| l.to_string())
        })
        .collect();
    assert_eq!(
        order,
        [
            "ld.global.u32 %r1, [%rd1];",
            // Reads %r1, which site 0 loads: the probe runs during the load, before it.
            "probe 0",
            "add.s32 %r2, %r1, 1;",
            "ld.global.u32 %r3, [%rd1+4];",
            // Overwrites %rd1, which site 1's address is in.
            "probe 1",
            "add.s64 %rd1, %rd1, 8;",
            "ld.global.u32 %r4, [%rd1];",
            "add.s64 %rd2, %rd1, 64;",
            "ld.global.u32 %r5, [%rd2];",
            "ld.global.u32 %r6, [%rd2+4];",
            // Sites 2, 3 and 4 run after the last of their loads, before the store.
            "probe 2",
            "probe 3",
            "probe 4",
            // A store's probe waits for the loads after it too.
            "st.global.u32 [%rd1], %r2;",
            "ld.global.u32 %r7, [%rd2+8];",
            "probe 5",
            "probe 6",
        ]
        .map(String::from)
    );
    assert_ptxas_accepts("runs", &out);

    // Nor past a statement that sets the carry flag (`.cc`), which the probe's
    // arithmetic could change before the `addc` that reads it.
    let text = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry carry(.param .u64 p)
{
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [p];
	ld.global.u32 %r1, [%rd1];
	add.cc.u32 %r3, %r4, 1;
	ld.global.u32 %r2, [%rd1+4];
	addc.u32 %r5, %r6, 0;
	st.global.u32 [%rd1+8], %r5;
	ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    let splice = access_splice("__bpftime_probe_24", 80, &["carry"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    let first = out.find("ld.global.u32 %r1").unwrap();
    let carry = out.find("add.cc.u32").unwrap();
    assert!(
        out[first..carry].contains("call (__bt_ret), __bpftime_probe_24"),
        "{out}"
    );
    assert_ptxas_accepts("carry", &out);
}

/// nvcc's vectorAdd moving its tiles by bulk copies (bpf-examples/cuda/vec_add.cu with
/// -DBULK_COPY): each copy into shared memory is a load of the bytes it copies from the
/// buffer its kernel argument names, each copy out a store or a reduction of c, sized by
/// the number or the register in the statement; a copy's shared-memory side is named as
/// missed. A probe of a copy whose size is in a register runs one lane at a time, with
/// that register in its size. Probed (called and inlined), the module passes ptxas.
#[test]
fn nvcc_bulk_copies_are_accesses_of_their_whole_size() {
    let text = String::from_utf8(read("vec_add_bulk.ptx")).unwrap();
    assert_eq!(
        text.matches("cp.async.bulk.shared::cluster.global").count(),
        2
    );
    assert_eq!(text.matches("cp.reduce.async.bulk.global").count(), 2);
    let module = PtxModule::parse(&text).unwrap();
    let k = kernel_named(&module, "vectorAdd");
    use AccessKind::*;
    use SiteSpace::*;
    let mut sites = k.access_sizes(ProbePoint::Access);
    sites.sort_by_key(|&(kind, size, _)| (kind as u32, size));
    // The register-sized copies have size 0 here: the probe reads the register.
    assert_eq!(
        sites,
        vec![
            (Load, 0, Global),
            (Load, 0, Global),
            (Load, 4, Global),
            (Load, 4, Global),
            (Store, 0, Global),
            (Store, 4, Global),
            (Store, 1024, Global),
            (Reduction, 0, Global),
            (Reduction, 1024, Global),
        ]
    );
    let mut args = k.access_base_args(ProbePoint::Access);
    args.sort();
    assert_eq!(
        args,
        vec![
            Some(0),
            Some(0),
            Some(1),
            Some(1),
            Some(2),
            Some(2),
            Some(2),
            Some(2),
            Some(2)
        ]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    assert_eq!(
        k.unseen_shared_accesses.len(),
        6,
        "{:?}",
        k.unseen_shared_accesses
    );
    assert!(k
        .unseen_shared_accesses
        .iter()
        .all(|m| m.contains("of a bulk copy is not probed")));
    let splice = access_splice("__bpftime_probe_21", 90, &[k.name.as_str()]);
    for (inline, out, probes) in called_and_inlined(&module, &splice, "__bpftime_probe_21") {
        assert_eq!(probes, 9, "{out}");
        // Four copies sized by a register: each probe loops over the lanes.
        assert_eq!(
            out.matches("setp.eq.u32 %__btq, %__btl, %__btk;").count(),
            4
        );
        let load = out
            .find("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes")
            .unwrap();
        let probe = &out[load..load + out[load..].find("@%__btz bra").unwrap()];
        assert!(probe.contains("cvt.u64.u32 %__btv, %r"), "{probe}");
        assert!(
            probe.contains(&format!("mov.u64 %__bta9, {};", (Load as u64) << 32)),
            "{probe}"
        );
        let store = out
            .find("cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r61], 1024;")
            .unwrap();
        let probe = &out[store..store + 4000.min(out.len() - store)];
        assert!(
            probe.contains(&format!(
                "mov.u64 %__bta9, {};",
                1024 | (Store as u64) << 32
            )),
            "{probe}"
        );
        assert_ptxas_accepts(&format!("vec-add-bulk-{inline}"), &out);
    }
}

/// sm_90's distributed shared memory: a `.shared::cluster` access is made generic as
/// such. An asynchronous copy into shared memory (`cp.async`) is a 16-byte load of
/// global memory, after which its probe runs (it writes no register); its write into
/// shared memory is said to be missed (by `.shared` probes only: `:ldst` probes never
/// looked at shared memory). A matrix load of four 8x8 matrices is a 16-byte row's load in
/// every lane. A tensor copy is a global load (its rows, see
/// `nvcc_tensor_copies_are_a_global_access_per_row_of_their_box`).
#[test]
fn cluster_shared_accesses_are_probed_async_copies_read_global_and_the_rest_is_named() {
    let text = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry cluster(.param .u64 out)
{
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	.shared .align 16 .b32 t[64];
	.shared .align 8 .b64 bar;
	mov.u32 %r1, t;
	ld.shared::cluster.u32 %r2, [%r1+8];
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r3, %r4, %r5, %r6}, [%r1];
	ld.param.u64 %rd3, [out];
	cp.async.ca.shared.global [%r1+16], [%rd3], 16;
	cp.async.commit_group;
	cp.async.wait_group 0;
	cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [t], [%rd3], 128, [bar];
	cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd3+64], 0x2000, [bar];
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [t], [%rd3, {%r2, %r3}], [bar];
	cp.async.bulk.prefetch.L2.global [%rd3], 256;
	st.global.u32 [%rd3+8], %r2;
	ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    let k = module.kernel("cluster").unwrap();
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::SharedAccess),
        vec![
            (Load, 4, Shared),
            (Load, 16, Shared),
            (Load, 16, Global),
            (Load, 128, Global),
            (Load, 8192, Global),
            (Load, 0, Global),
            (Store, 4, Global)
        ]
    );
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![
            (Load, 16, Global),
            (Load, 128, Global),
            (Load, 8192, Global),
            (Load, 0, Global),
            (Store, 4, Global)
        ]
    );
    // A prefetch reads nothing.
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    assert_eq!(
        k.unseen_shared_accesses.len(),
        3,
        "{:?}",
        k.unseen_shared_accesses
    );
    assert!(k.unseen_shared_accesses[0]
        .contains("the shared-memory write of an asynchronous copy is not probed"));
    assert!(k.unseen_shared_accesses[1]
        .contains("the shared-memory write of a bulk copy is not probed"));
    let splice = shared_access_splice("__bpftime_probe_18", 90, &["cluster"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert!(
        out.contains("cvt.u64.u32 %__bta6, %r1;\ncvta.shared::cluster.u64 %__bta6, %__bta6;\nadd.s64 %__bta6, %__bta6, 8;"),
        "{out}"
    );
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_18").count(),
        7
    );
    // The matrix load writes its address register's neighbours, not it: its probe runs
    // after it, in every lane (four matrices name 32 rows).
    let matrix = out.find("ldmatrix.sync").unwrap();
    let after = &out[matrix..matrix + out[matrix..].find("ld.param.u64 %rd3, [out];").unwrap()];
    assert!(
        after.contains("call (__bt_ret), __bpftime_probe_18"),
        "{after}"
    );
    assert!(!after.contains("%laneid"), "{after}");
    // The copy's probe: after it, with the global address (a register's is generic
    // already) and 16 bytes.
    let copy = out.find("cp.async.ca.shared.global").unwrap();
    let next = copy + out[copy..].find("cp.async.commit_group").unwrap();
    let probe = &out[copy..next];
    assert!(
        probe.contains("call (__bt_ret), __bpftime_probe_18"),
        "{probe}"
    );
    assert!(probe.contains("mov.b64 %__bta6, %rd3;"), "{probe}");
    assert!(
        probe.contains(&format!("mov.u64 %__bta9, {};", 16 | (Load as u64) << 32)),
        "{probe}"
    );
    assert_ptxas_accepts("cluster-shared", &out);

    // `:ldst` probes too, inlined.
    let mut splice = access_splice("__bpftime_probe_19", 90, &["cluster"]);
    splice.inline = true;
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(out.matches("_end:\n}").count(), 5, "{out}");
    assert_ptxas_accepts("cluster-ldst-inlined", &out);
}

/// nvcc's PTX of bpf-examples/cuda/matrix_rows.cu: its fill's 16-byte global load and
/// shared store, its matrix loads (`.x1` and `.x2` under a lane test, `.x4` not) and
/// stores as 16-byte rows, its 2-byte shared load and 4-byte global store; probed (called
/// and inlined), the module passes ptxas.
#[test]
fn nvcc_matrix_loads_and_stores_are_rows() {
    let text = String::from_utf8(read("matrix_rows.ptx")).unwrap();
    let module = PtxModule::parse(&text).unwrap();
    let k = kernel_named(&module, "matrix_rows");
    use AccessKind::*;
    use SiteSpace::*;
    let sites = k.access_sizes(ProbePoint::SharedAccess);
    // nvcc unrolls the REPS loop by four, with one more turn for the rest.
    let turns = text.matches("stmatrix.sync").count();
    assert_eq!(turns, 5);
    let mut want = vec![(Load, 16, Global), (Store, 16, Shared)];
    for _ in 0..turns {
        want.extend([(Load, 16, Shared), (Load, 16, Shared), (Load, 16, Shared)]);
        want.push((Store, 16, Shared));
    }
    want.extend([(Load, 2, Shared), (Store, 4, Global)]);
    assert_eq!(sites, want);
    assert!(
        k.unseen_shared_accesses.is_empty(),
        "{:?}",
        k.unseen_shared_accesses
    );
    let splice = shared_access_splice("__bpftime_probe_22", 90, &[k.name.as_str()]);
    for (inline, out, _) in called_and_inlined(&module, &splice, "__bpftime_probe_22") {
        // The .x1 and .x2 loads of every turn test their lanes.
        assert_eq!(
            out.matches("mov.u32 %__btl, %laneid;").count(),
            2 * turns,
            "{out}"
        );
        assert_ptxas_accepts(&format!("matrix-rows-{inline}"), &out);
    }
}

/// Matrix loads and stores (`ldmatrix`, `stmatrix`) of 8x8 16-bit matrices: each of the
/// warp's first 8, 16 or 32 lanes names one 16-byte row, which is its access, so the
/// probe runs under a lane test for one or two matrices (with the statement's own guard,
/// and through a generic address's space test); a store passes no value (a lane's
/// registers hold its share of the matrices, not its row). Other shapes are said missed.
#[test]
fn matrix_loads_and_stores_are_a_row_per_addressing_lane() {
    let text = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry matrices(.param .u64 out)
{
	.reg .pred %p<2>;
	.reg .b32 %r<12>;
	.reg .b64 %rd<4>;
	.shared .align 16 .b16 t[1024];
	mov.u32 %r1, t;
	mov.u32 %r9, %tid.x;
	setp.lt.u32 %p1, %r9, 64;
	ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r2}, [%r1];
	@!%p1 ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {%r3, %r4}, [%r1+256];
	stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%r1+512], {%r2, %r3, %r4, %r9};
	cvta.shared.u64 %rd1, t;
	ldmatrix.sync.aligned.m8n8.x2.b16 {%r5, %r6}, [%rd1];
	ld.param.u64 %rd3, [out];
	st.global.u32 [%rd3], %r5;
	ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    let k = module.kernel("matrices").unwrap();
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::SharedAccess),
        vec![
            (Load, 16, Shared),
            (Load, 16, Shared),
            (Store, 16, Shared),
            (Load, 16, Generic),
            (Store, 4, Global)
        ]
    );
    assert!(
        k.unseen_shared_accesses.is_empty(),
        "{:?}",
        k.unseen_shared_accesses
    );
    let splice = shared_access_splice("__bpftime_probe_21", 90, &["matrices"]);
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(
        out.matches("call (__bt_ret), __bpftime_probe_21").count(),
        5,
        "{out}"
    );
    // One matrix: its 8 rows' lanes; two under `@!%p1`: 16 lanes where %p1 is false.
    assert!(
        out.contains(
            "mov.u32 %__btl, %laneid;\nsetp.lt.u32 %__btq, %__btl, 8;\nmov.pred %__btp, %__btq;"
        ),
        "{out}"
    );
    assert!(
        out.contains("setp.lt.u32 %__btq, %__btl, 16;\nnot.pred %__btr, %p1;\nand.pred %__btp, %__btq, %__btr;"),
        "{out}"
    );
    // The generic one: its lanes, and only where the address is shared memory.
    assert!(
        out.contains("setp.lt.u32 %__btq, %__btl, 16;\nand.pred %__btp, %__btq, %__btp;"),
        "{out}"
    );
    // Four matrices stored: every lane, no lane test, no value.
    let store = out.find("stmatrix.sync").unwrap();
    let probe = &out[store..store + out[store..].find("cvta.shared.u64 %rd1, t;").unwrap()];
    assert!(
        probe.contains("call (__bt_ret), __bpftime_probe_21"),
        "{probe}"
    );
    assert!(!probe.contains("%laneid"), "{probe}");
    assert!(!probe.contains("%__bta7, %r"), "{probe}");
    assert_ptxas_accepts_for("matrices", &out, 90);
    // Inlined, the lane test guards the body as it guarded the call.
    let mut splice = shared_access_splice("__bpftime_probe_21", 90, &["matrices"]);
    splice.inline = true;
    let out = module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap();
    assert_eq!(out.matches("_end:\n}").count(), 5, "{out}");
    assert_eq!(out.matches("mov.u32 %__btl, %laneid;").count(), 3, "{out}");
    assert_ptxas_accepts_for("matrices-inlined", &out, 90);

    // sm_100's 8-bit shapes are not rows of 16 bytes: said missed.
    let other = text.replace(
        "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r2}, [%r1];",
        "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%r2, %r10}, [%r1];",
    );
    let module = PtxModule::parse(&other).unwrap();
    let k = module.kernel("matrices").unwrap();
    assert_eq!(
        k.unseen_shared_accesses.len(),
        1,
        "{:?}",
        k.unseen_shared_accesses
    );
    assert!(k.unseen_shared_accesses[0].contains("this shape of ldmatrix is not probed"));
}

/// nvcc's PTX of bpf-examples/cuda/tma_copy.cu: its tensor load (`cp.async.bulk.tensor.2d`
/// into shared memory) and tensor store are a global load and store each, the only global
/// accesses the kernel has; the calls look the map up in the module's table of tensor
/// maps and run once per row of the box, one issuing lane at a time. Probed (called and
/// inlined), the module passes ptxas.
#[test]
fn nvcc_tensor_copies_are_a_global_access_per_row_of_their_box() {
    use bpftime_gpu_ptx::ptx::TENSOR_MAPS_GLOBAL;
    let text = String::from_utf8(read("tma_copy.ptx")).unwrap();
    assert_eq!(text.matches("cp.async.bulk.tensor.2d").count(), 2);
    let module = PtxModule::parse(&text).unwrap();
    let k = kernel_named(&module, "tma_double");
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![(Load, 0, Global), (Store, 0, Global)]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    // Neither is one of the buffers the kernel is handed: the map says where.
    assert_eq!(k.access_base_args(ProbePoint::Access), vec![None, None]);
    let splice = access_splice("__bpftime_probe_31", 90, &[k.name.as_str()]);
    for (inline, out, probes) in called_and_inlined(&module, &splice, "__bpftime_probe_31") {
        assert_eq!(probes, 2, "{out}");
        assert_eq!(
            out.matches(&format!(
                ".visible .global .align 8 .u64 {TENSOR_MAPS_GLOBAL};"
            ))
            .count(),
            1
        );
        let load = out.find("cp.async.bulk.tensor.2d.shared::cluster").unwrap();
        let probe = &out[load..load + out[load..].find("_lane;\n}").unwrap()];
        // The map from the statement's register, looked up by its 128 bytes; the box's
        // second coordinate moved by the row; the first clipped.
        assert!(probe.contains("mov.b64 %__btt0, %rd3;"), "{probe}");
        assert!(probe.contains(&format!("ld.global.u64 %__btt1, [{TENSOR_MAPS_GLOBAL}];")));
        assert_eq!(probe.matches("ld.u64 %__btt2, [%__btt0+").count(), 16);
        assert!(probe.contains("add.s32 %__btu2, %__btu2, %r2;"), "{probe}");
        assert!(probe.contains("mov.b32 %__btu2, %r1;"), "{probe}");
        assert!(probe.contains(&format!(
            "or.b64 %__bta9, %__btt3, {};",
            (Load as u64) << 32
        )));
        assert_ptxas_accepts(&format!("tma-copy-{inline}"), &out);
    }
}

/// Tensor copies as a hand would write them: coordinates as numbers, three, five and one
/// dimensions, under a guard, a reduction; copies in im2col mode and maps named by a
/// variable are named as missed. Probed, the module passes ptxas.
#[test]
fn tensor_copies_of_every_rank_and_form_are_probed_or_named() {
    let text = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry tensors(.param .align 64 .b8 tensors_param_0[128], .param .u32 n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	.shared .align 128 .b8 t[4096];
	.shared .align 8 .b64 bar;
	ld.param.u32 %r1, [n];
	mov.b64 %rd1, tensors_param_0;
	cvta.param.u64 %rd2, %rd1;
	setp.lt.u32 %p1, %r1, 4;
	@%p1 cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [t], [%rd2, {%r1, 0, 2}], [bar];
	cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%rd2, {%r1, %r2, %r3, %r4, -1}], [t];
	cp.reduce.async.bulk.tensor.1d.global.shared::cta.add.tile.bulk_group [%rd2, {%r1}], [t];
	ret;
}
";
    let module = PtxModule::parse(text).unwrap();
    let k = module.kernel("tensors").unwrap();
    use AccessKind::*;
    use SiteSpace::*;
    assert_eq!(
        k.access_sizes(ProbePoint::Access),
        vec![
            (Load, 0, Global),
            (Store, 0, Global),
            (Reduction, 0, Global)
        ]
    );
    assert!(k.unseen_accesses.is_empty(), "{:?}", k.unseen_accesses);
    let splice = access_splice("__bpftime_probe_32", 90, &["tensors"]);
    for (inline, out, probes) in called_and_inlined(&module, &splice, "__bpftime_probe_32") {
        assert_eq!(probes, 3, "{out}");
        // The guard is the statement's, with the lane's turn.
        assert!(out.contains("and.pred %__btp, %__btq, %p1;"), "{out}");
        assert!(out.contains("add.s32 %__btu2, %__btu2, -1;"), "{out}");
        assert_ptxas_accepts(&format!("tensor-forms-{inline}"), &out);
    }

    let missed = text
        .replace(
            "\tret;",
            "\tcp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes \
             [t], [%rd2, {%r1, %r2, %r3}], [bar], {%h1};\n\
             \tcp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes \
             [t], [gmap, {%r1}], [bar];\n\tret;",
        )
        .replace(".reg .b64 %rd<4>;", ".reg .b64 %rd<4>;\n\t.reg .b16 %h<2>;");
    let module = PtxModule::parse(&missed).unwrap();
    let k = module.kernel("tensors").unwrap();
    assert_eq!(k.access_sizes(ProbePoint::Access).len(), 3);
    assert_eq!(k.unseen_accesses.len(), 2, "{:?}", k.unseen_accesses);
    assert!(k.unseen_accesses[0].contains("im2col mode is not probed"));
    assert!(k.unseen_accesses[1].contains("a tensor map named by a variable (`gmap`)"));
}
