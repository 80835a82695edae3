//! What memtrace's memory-access probe (the clang-built `bpf-examples` object) becomes on
//! the GPU, compiled as a session compiles it (its arrays in the context's shard window)
//! and spliced into nvcc's vectorAdd: the work it adds to every access, which decides
//! its overhead, read from the PTX; and the spliced module checked by NVIDIA's `ptxas`
//! where it is found (as `splice.rs` finds it).

use std::collections::HashMap;

mod support;

use support::{assert_ptxas_accepts, kernel_named, nvcc_module};

use bpftime_gpu_attach::device_maps::{RuntimeConfig, ShardEntry, SHARD_WINDOW_SPAN};
use bpftime_gpu_attach::probe::{compile_probe, DeviceMapRef};
use bpftime_gpu_attach::ptx::{ProbeCall, ProbePoint, Splice, Version};
use bpftime_isa::Insn;
use goblin::elf::Elf;

const SYMBOL: &str = "__bpftime_probe_9";
/// Where the test puts the shard window, as a session's arena would.
const WINDOW: u64 = 0x3000_0010_0000;

/// memtrace's arrays (its source's sizes) by name: entries of 8-byte values.
const ARRAYS: &[(&str, u32)] = &[
    ("accesses", 512),
    ("collisions", 1),
    ("offset_hist_arg0", 64),
    ("offset_hist_arg1", 64),
    ("offset_hist_arg2", 64),
    ("offset_hist_arg3", 64),
    ("offset_hist_arg4", 64),
    ("offset_hist_arg5", 64),
];

/// The program of section `section` of `object`, its map references given ids, with the
/// maps those ids name: memtrace's arrays laid out in the shard window, each sharded.
fn program(object: &str, section: &str) -> (Vec<Insn>, HashMap<u32, DeviceMapRef>, RuntimeConfig) {
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
    let mut next_value = WINDOW;
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
            let map = match ARRAYS.iter().find(|(n, _)| *n == name) {
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
    assert!(next_value - WINDOW < SHARD_WINDOW_SPAN);
    let config = RuntimeConfig {
        shards,
        ..RuntimeConfig::default()
    };
    (insns, maps, config)
}

/// memtrace's access probe at every global access of vectorAdd matches addresses across
/// the warp only for its histogram, whose slot each lane computes, and:
/// - the count per kernel and kind adds to an address made of the call site's
///   constants, the same in every lane: the first active lane adds for all, no match;
/// - the log2 of the offset, a loop in eBPF (which has no such instruction), is the
///   GPU's `clz` again;
/// - the histogram's add is known to be in the shard window (the verifier bounded the
///   address to the array's values): no compare against the window;
/// - the eBPF stack stays in registers, and the probe has no stack frame at all: the
///   record of the sampled timeline reaches the ring buffer's writer as words in
///   registers, so neither the lookup keys the program stores nor a copy of the record
///   is kept in local memory (nor a frame's address worked out at every access);
/// - spliced, the kernel reads its SM's id once, at entry, for all its probes' adds.
#[test]
fn memtrace_matches_only_its_histogram_and_keeps_no_stack_in_memory() {
    let (insns, maps, config) = program(bpftime_bpf_examples::MEMTRACE_BPF_O, "cuda:*:ldst");
    let probe = compile_probe(ProbePoint::Access, &insns, &maps, &config, 90, SYMBOL)
        .expect("memtrace's probe compiles");
    let head = format!(".visible .func  (.param .b64 func_retval0) {SYMBOL}(");
    let body = &probe.ptx[probe.ptx.find(&head).expect("the probe function")..];
    assert_eq!(body.matches("match.any").count(), 1, "{body}");
    assert!(body.contains("clz.b64"), "{body}");
    assert!(!body.contains("popc.b64"), "{body}");
    let window_start = format!("{}", WINDOW.wrapping_neg() as i64);
    assert!(!body.contains(&window_start), "{body}");
    let own = &body[..body.find("\n}").expect("the probe's end")];
    let depot = own
        .lines()
        .find(|l| l.contains("__local_depot"))
        .and_then(|l| l.rsplit('[').next())
        .and_then(|l| l.split(']').next())
        .map(|n| n.parse::<u32>().expect("a depot size"));
    assert!(
        depot.is_none(),
        "the probe keeps {depot:?} bytes in local memory (the eBPF stack is 512):\n{body}"
    );

    let module = nvcc_module();
    let kernel = kernel_named(&module, "vectorAdd").name.clone();
    let splice = Splice {
        definitions: bpftime_gpu_attach::ptx::strip_header(&probe.ptx),
        needs_version: Some(Version::new(7, 8)),
        needs_sm: Some(90),
        calls: vec![(
            kernel,
            vec![ProbeCall {
                point: ProbePoint::Access,
                symbol: SYMBOL.into(),
            }],
        )],
        inline: true,
    };
    let spliced = module
        .splice(&splice, Version::newest_for_driver(13000))
        .expect("splices");
    let kernel_text = &spliced[spliced.find(".entry _Z9vectorAdd").expect("vectorAdd")..];
    assert_eq!(kernel_text.matches("%smid").count(), 1, "{kernel_text}");
    assert_ptxas_accepts("memtrace-vectorAdd", &spliced);
}
