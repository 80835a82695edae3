//! What the splice tests share: the fixtures (nvcc's output, gpu-ptx/tests/fixtures/make.sh), the
//! nvcc module's kernels, clang-built programs of bpf-examples with their maps, and
//! NVIDIA's `ptxas` as the judge of spliced PTX. Each test crate uses part of it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bpftime_gpu_device::device_maps::{RuntimeConfig, ShardEntry, SHARD_WINDOW_SPAN};
use bpftime_gpu_probe::DeviceMapRef;
use bpftime_gpu_ptx::fatbin::Image;
use bpftime_gpu_ptx::ptx::{Kernel, ProbeCall, ProbePoint, PtxModule, Splice, Version};
use bpftime_gpu_ptx::toolchain;
use bpftime_isa::Insn;
use goblin::elf::Elf;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gpu-ptx/tests/fixtures")
        .join(name)
}

pub fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

pub fn ptxas() -> Option<PathBuf> {
    toolchain::ptxas_for_tests()
}

pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpftime-splice-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

pub fn assert_ptxas_accepts(tag: &str, ptx: &str) {
    assert_ptxas_accepts_for(tag, ptx, 90);
}

pub fn assert_ptxas_accepts_for(tag: &str, ptx: &str, sm: u32) {
    let Some(ptxas) = ptxas() else { return };
    if let Err(e) = toolchain::ptxas_accepts(&ptxas, tag, ptx, sm, false) {
        panic!("ptxas refused the spliced module {tag} for sm_{sm}: {e}\n{ptx}");
    }
}

/// kernels.fatbin's PTX for sm_90 (nvcc's), parsed.
pub fn nvcc_module() -> PtxModule {
    let bytes = read("kernels.fatbin");
    let (text, _) = Image::from_bytes(&bytes)
        .unwrap()
        .ptx_for(90)
        .unwrap()
        .expect("PTX");
    PtxModule::parse(&text).unwrap()
}

/// nvcc's vectorAdd (kernels.fatbin) with `probe_ptx` (a module `compile_probe` wrote)
/// spliced in, its body in place of each call at `point`, as a session splices it for
/// sm_90; checked by ptxas (as `tag`) where it is found.
pub fn vector_add_with(probe_ptx: &str, symbol: &str, point: ProbePoint, tag: &str) -> String {
    let module = nvcc_module();
    let kernel = kernel_named(&module, "vectorAdd").name.clone();
    let splice = Splice {
        definitions: bpftime_gpu_ptx::ptx::strip_header(probe_ptx),
        needs_version: Some(Version::new(7, 8)),
        needs_sm: Some(90),
        calls: vec![(
            kernel,
            vec![ProbeCall {
                point,
                symbol: symbol.into(),
            }],
        )],
        inline: true,
    };
    let spliced = module
        .splice(&splice, Version::newest_for_driver(13000))
        .expect("splices");
    assert_ptxas_accepts(tag, &spliced);
    spliced
}

/// The kernel of `module` whose (mangled) name contains `name`.
pub fn kernel_named<'m>(module: &'m PtxModule, name: &str) -> &'m Kernel {
    module
        .kernels
        .iter()
        .find(|k| k.name.contains(name))
        .unwrap_or_else(|| panic!("no {name}"))
}

/// The program of section `section` of a clang-built `object`, its map references given
/// ids, with the maps those ids name: the arrays `arrays` names (entries of 8-byte values)
/// laid out in a shard window at `window`, each sharded, as a session's arena would; other
/// maps by a descriptor's address alone.
pub fn clang_program(
    object: &str,
    section: &str,
    arrays: &[(&str, u32)],
    window: u64,
) -> (Vec<Insn>, HashMap<u32, DeviceMapRef>, RuntimeConfig) {
    let bytes = std::fs::read(object).expect("the memtrace object");
    let elf = Elf::parse(&bytes).expect("an ELF object");
    let (index, header) = elf
        .section_headers
        .iter()
        .enumerate()
        .find(|(_, s)| elf.shdr_strtab.get_at(s.sh_name) == Some(section))
        .unwrap_or_else(|| panic!("no section {section} in {object}"));
    let code = &bytes[header.sh_offset as usize..(header.sh_offset + header.sh_size) as usize];
    let mut insns = bpftime_isa::decode(code).expect("eBPF instructions");
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut maps = HashMap::new();
    let mut shards = Vec::new();
    let mut next_value = window;
    for (target, relocs) in &elf.shdr_relocs {
        if elf.section_headers[*target].sh_info as usize != index {
            continue;
        }
        for r in relocs.iter() {
            let sym = elf.syms.get(r.r_sym).expect("a symbol");
            let name = elf.strtab.get_at(sym.st_name).expect("a name").to_string();
            let fresh = ids.len() as u32 + 2;
            let id = *ids.entry(name.clone()).or_insert(fresh);
            let pc = r.r_offset as usize / 8;
            assert!(insns[pc].is_lddw(), "{name} is not loaded by an lddw");
            insns[pc].src = bpftime_isa::opcode::PSEUDO_MAP_FD;
            insns[pc].imm = id as i32;
            if maps.contains_key(&id) {
                continue;
            }
            let desc = 0x3000_0000_1000 + u64::from(id) * 0x100;
            let map = match arrays.iter().find(|(n, _)| *n == name) {
                Some(&(_, entries)) => {
                    let array = bpftime_jit_ptx::ArrayMapLayout {
                        values: next_value,
                        key_stride: 8,
                        max_entries: entries,
                        update_size: 8,
                        per_cpu: None,
                    };
                    shards.push(ShardEntry::in_window(
                        next_value,
                        u64::from(entries) * 8,
                        256,
                    ));
                    next_value += u64::from(entries) * 8;
                    DeviceMapRef {
                        desc,
                        values: Some(array.values),
                        array: Some(array),
                    }
                }
                None => DeviceMapRef {
                    desc,
                    values: None,
                    array: None,
                },
            };
            maps.insert(id, map);
        }
    }
    assert!(next_value - window < SHARD_WINDOW_SPAN);
    let config = RuntimeConfig {
        shards,
        ..RuntimeConfig::default()
    };
    (insns, maps, config)
}
