//! GPU code generation without a GPU: every bpf_conformance program, every GPU example
//! in bpf-examples and the GPU helper probe compile to PTX that NVIDIA's `ptxas`
//! (CUDA 13.0, the device's release) accepts for sm_90, and to AMDGCN code objects
//! for gfx90a and gfx942 that are valid ELF for their chip and that
//! `llvm-objdump-19` disassembles.
//!
//! `ptxas` is found through `PTXAS`, then `PATH`, then the `nvidia-cuda-nvcc` wheel
//! that scripts/setup.sh installs with pip. Without it these tests fail, unless
//! `BPFTIME_NO_PTXAS` is set, in which case they say so and skip the ptxas part.

use std::path::{Path, PathBuf};
use std::process::Command;

use bpftime_conformance::gpu::{conformance_ptx, ConformanceGpuEnv, HELPER_PROBE};
use bpftime_conformance::{default_suite_dir, parse_test, suite_files, test_name};
use bpftime_isa::asm::assemble;
use bpftime_isa::{decode, Insn};
use bpftime_jit_amdgcn::{AmdGpuArch, AmdgcnOptions};
use bpftime_jit_ptx::{compile, ArrayMapLayout, GpuEnv, PtxOptions, PtxProgram, StandardGpuEnv};
use goblin::elf::Elf;

const EM_AMDGPU: u16 = 224;
const OBJDUMP: &str = "llvm-objdump-19";

/// Every conformance program, assembled, by test name.
fn conformance_programs() -> Vec<(String, Vec<Insn>)> {
    let files = suite_files(&default_suite_dir()).unwrap_or_else(|e| panic!("{e}"));
    files
        .iter()
        .map(|path| {
            let name = test_name(path);
            let text = std::fs::read_to_string(path).expect("reading a .data file");
            let case = parse_test(&name, &text).unwrap_or_else(|e| panic!("{e}"));
            let prog = assemble(&case.asm).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, prog)
        })
        .collect()
}

/// A fresh scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpftime-gpu-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

fn ptxas() -> Option<PathBuf> {
    bpftime_gpu_ptx::toolchain::ptxas_for_tests()
}

/// Runs ptxas on `file` for sm_90; `relocatable` (`-c`) when the PTX calls device
/// functions that the runtime links later. Returns ptxas's complaint on failure.
fn run_ptxas(ptxas: &Path, file: &Path, relocatable: bool) -> Result<(), String> {
    bpftime_gpu_ptx::toolchain::run_ptxas(ptxas, file, 90, relocatable).map_err(|e| e.to_string())
}

#[test]
fn ptx_of_every_conformance_test_passes_ptxas() {
    let programs = conformance_programs();
    let dir = scratch("ptx");
    let mut failures = Vec::new();
    let mut files = Vec::new();
    for (name, prog) in &programs {
        match conformance_ptx(prog, &PtxOptions::default()) {
            Ok(p) => {
                // Complete on its own: nothing left for a runtime to link.
                assert!(p.externs.is_empty(), "{name}: calls {:?}", p.externs);
                assert!(p.ptx.contains(".target sm_90") && p.ptx.contains(".version 7.8"));
                let file = dir.join(format!("{name}.ptx"));
                std::fs::write(&file, &p.ptx).unwrap();
                files.push((name, file));
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} conformance programs do not compile to PTX:\n{}",
        failures.len(),
        programs.len(),
        failures.join("\n")
    );
    let Some(ptxas) = ptxas() else { return };
    for (name, file) in &files {
        if let Err(e) = run_ptxas(&ptxas, file, false) {
            failures.push(format!("{name}: {e}"));
        }
    }
    println!(
        "ptxas -arch=sm_90: {} of {} conformance programs accepted",
        files.len() - failures.len(),
        files.len()
    );
    assert!(
        failures.is_empty(),
        "ptxas refused:\n{}",
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The GPU example objects, built by bpf-examples' Makefile into `dir`.
fn build_gpu_examples(dir: &Path) -> Vec<PathBuf> {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bpf-examples");
    let out = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&examples)
        .arg(format!("OUT={}", dir.display()))
        .arg("gpu")
        .output()
        .expect("make runs (apt-get install make)");
    assert!(
        out.status.success(),
        "make gpu in bpf-examples failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut objects: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".bpf.o"))
        .collect();
    objects.sort();
    objects
}

/// A GPU program from an object: its section, its instructions with each map
/// reference (`lddw` relocated against `.maps`) replaced by a distinct fake device
/// address, and the map names by address.
struct GpuProgram {
    section: String,
    insns: Vec<Insn>,
    maps: Vec<(String, u64)>,
}

fn gpu_programs(object: &Path) -> Vec<GpuProgram> {
    let bytes = std::fs::read(object).unwrap();
    let elf = Elf::parse(&bytes).expect("a BPF ELF object");
    let section_name = |i: usize| {
        elf.section_headers
            .get(i)
            .and_then(|s| elf.shdr_strtab.get_at(s.sh_name))
            .unwrap_or("")
            .to_string()
    };
    let mut programs = Vec::new();
    for (index, header) in elf.section_headers.iter().enumerate() {
        let name = section_name(index);
        if !(name.starts_with("kprobe/")
            || name.starts_with("kretprobe/")
            || name.starts_with("cuda:"))
        {
            continue;
        }
        // Launch programs (`cuda:KERNEL:launch`) run on the CPU.
        if matches!(
            bpftime_runtime::parse_cuda_section(&name),
            Some(Ok(p)) if !p.kind.on_gpu()
        ) {
            continue;
        }
        let start = header.sh_offset as usize;
        let mut insns = decode(&bytes[start..start + header.sh_size as usize]).unwrap();
        let mut maps: Vec<(String, u64)> = Vec::new();
        for (reloc_index, relocs) in &elf.shdr_relocs {
            if elf.section_headers[*reloc_index].sh_info as usize != index {
                continue;
            }
            for r in relocs.iter() {
                let sym = elf.syms.get(r.r_sym).expect("relocation symbol");
                let target = section_name(sym.st_shndx);
                let slot = r.r_offset as usize / 8;
                if target.starts_with(".rodata") {
                    // Global data (bpf_printk's format): where its map's value would be,
                    // plus the offset the instruction holds.
                    let addr = 0x7e00_0000_0000 + insns[slot].imm as u32 as u64;
                    insns[slot].src = 0;
                    insns[slot].imm = addr as u32 as i32;
                    insns[slot + 1].imm = (addr >> 32) as u32 as i32;
                    continue;
                }
                assert_eq!(target, ".maps", "{name}: relocation against {target}");
                let map = elf.strtab.get_at(sym.st_name).unwrap_or("").to_string();
                let next = 0x7f00_0000_0000 + 0x100_0000 * maps.len() as u64;
                let addr = match maps.iter().find(|(n, _)| *n == map) {
                    Some(&(_, a)) => a,
                    None => {
                        maps.push((map, next));
                        next
                    }
                };
                assert!(insns[slot].is_lddw(), "{name}: map reference at {slot}");
                insns[slot].src = 0;
                insns[slot].imm = addr as u32 as i32;
                insns[slot + 1].imm = (addr >> 32) as u32 as i32;
            }
        }
        programs.push(GpuProgram {
            section: name,
            insns,
            maps,
        });
    }
    programs
}

/// The array maps of gpu_block_count, where the runtime would put them.
struct BlockCountMaps(Vec<(String, u64)>);

impl GpuEnv for BlockCountMaps {
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.0
            .iter()
            .any(|(name, addr)| name == "block_starts" && *addr == map)
            .then_some(ArrayMapLayout {
                values: map,
                key_stride: 8,
                max_entries: 1024,
                update_size: 8,
                per_cpu: None,
            })
    }
}

fn write_ptx(dir: &Path, name: &str, p: &PtxProgram) -> PathBuf {
    let file = dir.join(format!("{name}.ptx"));
    std::fs::write(&file, &p.ptx).unwrap();
    file
}

#[test]
fn gpu_examples_and_the_helper_probe_pass_ptxas_and_build_for_amd() {
    let dir = scratch("examples");
    let objects = build_gpu_examples(&dir);
    assert!(!objects.is_empty(), "bpf-examples has no GPU examples");
    let runtime_helpers: Vec<&str> = bpftime_jit_ptx::extern_helpers()
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    let mut checks: Vec<(String, PathBuf, bool)> = Vec::new();
    let mut block_count_seen = false;
    for object in &objects {
        let programs = gpu_programs(object);
        let stem = object
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".bpf.o", "");
        if stem == "launchsnoop" {
            // Launch programs only: CPU code, checked by the verifier as such.
            assert!(programs.is_empty(), "launchsnoop has device probes now?");
            continue;
        }
        assert!(!programs.is_empty(), "{stem}: no kprobe/ or cuda: sections");
        for (i, prog) in programs.iter().enumerate() {
            let what = format!("{stem} {}", prog.section);
            let p = compile(&prog.insns, &StandardGpuEnv, &PtxOptions::default())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            for e in &p.externs {
                assert!(runtime_helpers.contains(&e.as_str()), "{what}: calls {e}");
            }
            let file = write_ptx(&dir, &format!("{stem}_{i}"), &p);
            checks.push((what.clone(), file, !p.externs.is_empty()));
            for arch in [AmdGpuArch::Gfx90a, AmdGpuArch::Gfx942] {
                let o = bpftime_jit_amdgcn::compile(
                    &prog.insns,
                    &StandardGpuEnv,
                    &AmdgcnOptions {
                        arch,
                        ..AmdgcnOptions::default()
                    },
                )
                .unwrap_or_else(|e| panic!("{what} for {}: {e}", arch.name()));
                let elf = Elf::parse(&o.elf).unwrap();
                assert_eq!(elf.header.e_machine, EM_AMDGPU);
                assert_eq!(elf.header.e_flags & 0xff, arch.elf_mach());
            }
            if stem == "gpu_block_count" {
                block_count_seen = true;
                // Through the runtime's map helper, and with the array map inlined,
                // which leaves nothing to link.
                assert_eq!(p.externs, vec!["bpftime_gpu_map_lookup_elem".to_string()]);
                let inlined = compile(
                    &prog.insns,
                    &BlockCountMaps(prog.maps.clone()),
                    &PtxOptions::default(),
                )
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(inlined.externs.is_empty(), "{:?}", inlined.externs);
                for reg in ["%tid.x", "%ctaid.x", "atom.add.u64"] {
                    assert!(inlined.ptx.contains(reg), "{what}: no {reg}");
                }
                let file = write_ptx(&dir, &format!("{stem}_{i}_inlined"), &inlined);
                checks.push((format!("{what} (map inlined)"), file, false));
            }
        }
    }
    assert!(block_count_seen, "gpu_block_count was not built");
    let probe = compile(
        &assemble(HELPER_PROBE).unwrap(),
        &StandardGpuEnv,
        &PtxOptions::default(),
    )
    .expect("the helper probe compiles");
    assert!(probe.externs.is_empty());
    checks.push((
        "helper probe".into(),
        write_ptx(&dir, "helper_probe", &probe),
        false,
    ));

    let Some(ptxas) = ptxas() else { return };
    let failures: Vec<String> = checks
        .iter()
        .filter_map(|(what, file, relocatable)| {
            run_ptxas(&ptxas, file, *relocatable)
                .err()
                .map(|e| format!("{what}: {e}"))
        })
        .collect();
    println!(
        "ptxas -arch=sm_90: {} of {} GPU example and probe modules accepted",
        checks.len() - failures.len(),
        checks.len()
    );
    assert!(
        failures.is_empty(),
        "ptxas refused:\n{}",
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn amdgcn_of_every_conformance_test_is_valid_elf_and_disassembles() {
    let programs = conformance_programs();
    for arch in [AmdGpuArch::Gfx90a, AmdGpuArch::Gfx942] {
        let dir = scratch(arch.name());
        let mut files = Vec::new();
        for (name, prog) in &programs {
            let o = bpftime_jit_amdgcn::compile(
                prog,
                &ConformanceGpuEnv,
                &AmdgcnOptions {
                    arch,
                    ..AmdgcnOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name} for {}: {e}", arch.name()));
            assert!(o.externs.is_empty(), "{name}: calls {:?}", o.externs);
            let elf = Elf::parse(&o.elf).unwrap_or_else(|e| panic!("{name}: not ELF: {e}"));
            assert_eq!(elf.header.e_machine, EM_AMDGPU, "{name}");
            assert_eq!(
                elf.header.e_flags & 0xff,
                arch.elf_mach(),
                "{name}: e_flags {:#x}",
                elf.header.e_flags
            );
            let file = dir.join(format!("{name}.o"));
            std::fs::write(&file, &o.elf).unwrap();
            files.push(file);
        }
        let out = match Command::new(OBJDUMP)
            .arg("-d")
            .arg(format!("--mcpu={}", arch.name()))
            .args(&files)
            .output()
        {
            Ok(out) => out,
            Err(e) => {
                eprintln!(
                    "{OBJDUMP} cannot run ({e}): not disassembling (apt-get install llvm-19)"
                );
                return;
            }
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{OBJDUMP} failed: {stderr}");
        assert!(
            !stderr.contains("warning") && !stderr.contains("error"),
            "{stderr}"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("<bpf_prog_kernel>:").count(),
            files.len(),
            "every object's kernel disassembles"
        );
        assert!(
            !text.contains("<unknown>"),
            "undecodable instructions for {}",
            arch.name()
        );
        println!(
            "{}: {} conformance programs are EM_AMDGPU ELF and disassemble",
            arch.name(),
            files.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
