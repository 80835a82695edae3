//! GPU probes compiled once are answered from the on-disk cache in later runs: the same
//! inputs give the stored PTX, and any input that differs (or another build of bpftime)
//! compiles afresh.

use std::collections::HashMap;

use bpftime_gpu_attach::device_maps::RuntimeConfig;
use bpftime_gpu_attach::probe::{compile_probe_cached, CachedProbe, DeviceMapRef, ProbeCache};
use bpftime_gpu_attach::ProbePoint;
use bpftime_isa::asm::assemble;
use bpftime_isa::Insn;
use bpftime_jit_ptx::ArrayMapLayout;

/// A counter in an array map, and the clock read into the stack.
fn counter() -> Vec<Insn> {
    let mut insns = assemble(
        "stw [%r10-4], 0\nlddw %r1, 2\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, +4\n\
         mov %r1, 1\nlock add [%r0+0], %r1\ncall 5\nstxdw [%r10-16], %r0\nmov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && insn.imm == 2 {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    insns
}

fn maps(desc: u64) -> HashMap<u32, DeviceMapRef> {
    let array = ArrayMapLayout {
        values: desc + 0x100,
        key_stride: 8,
        max_entries: 4,
        update_size: 8,
        per_cpu: None,
    };
    let map = DeviceMapRef {
        desc,
        values: Some(array.values),
        array: Some(array),
    };
    [(2u32, map)].into_iter().collect()
}

fn compile(cache: &ProbeCache, desc: u64, config: &RuntimeConfig) -> CachedProbe {
    compile_probe_cached(
        Some(cache),
        ProbePoint::Exit,
        &counter(),
        &maps(desc),
        config,
        90,
        "__bpftime_probe_3",
    )
    .expect("compiles")
}

fn probes_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn a_probe_compiled_once_is_read_back_and_other_inputs_compile_afresh() {
    let dir = std::env::temp_dir().join(format!("bpftime-probe-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = ProbeCache::at(&dir, "build A");
    let config = RuntimeConfig {
        pid_tgid_at: 0x3000_0000_0000,
        trace_ring: 0x3000_0000_0100,
        shards: vec![],
    };
    let first = compile(&cache, 0x3000_0000_1000, &config);
    assert!(first.ptx.contains("__bpftime_probe_3"), "{}", first.ptx);
    assert!(first.clock_offset.is_some(), "the probe reads the clock");
    let files = probes_in(&dir);
    assert_eq!(files.len(), 1, "{files:?}");

    // The same inputs come from the file: what it holds is what is answered.
    let stored = std::fs::read_to_string(&files[0]).unwrap();
    let ptx_at = stored.rfind('\0').unwrap() + 1;
    let marked = format!(
        "{}{}",
        &stored[..ptx_at],
        stored[ptx_at..].replace("__bpftime_probe_3", "__bpftime_probe_3_from_disk")
    );
    std::fs::write(&files[0], &marked).unwrap();
    let again = compile(&cache, 0x3000_0000_1000, &config);
    assert!(again.ptx.contains("__bpftime_probe_3_from_disk"));
    assert_eq!(again.clock_offset, first.clock_offset);
    // The store may number the same map differently in another run: the code is the
    // same, and so is the answer.
    let mut renumbered = counter();
    for insn in renumbered.iter_mut().filter(|i| i.is_lddw() && i.imm == 2) {
        insn.imm = 9;
    }
    let by_other_id: HashMap<u32, DeviceMapRef> = maps(0x3000_0000_1000)
        .into_values()
        .map(|m| (9, m))
        .collect();
    let same = compile_probe_cached(
        Some(&cache),
        ProbePoint::Exit,
        &renumbered,
        &by_other_id,
        &config,
        90,
        "__bpftime_probe_3",
    )
    .unwrap();
    assert!(same.ptx.contains("__bpftime_probe_3_from_disk"));
    std::fs::write(&files[0], &stored).unwrap();
    assert_eq!(compile(&cache, 0x3000_0000_1000, &config), first);

    // Another map address, another configuration, another build: compiled, not read.
    let moved = compile(&cache, 0x3000_0000_2000, &config);
    assert_ne!(moved.ptx, first.ptx);
    let other_ring = RuntimeConfig {
        trace_ring: 0x3000_0000_0200,
        ..config.clone()
    };
    assert!(!compile(&cache, 0x3000_0000_1000, &other_ring)
        .ptx
        .contains("_from_disk"));
    std::fs::write(&files[0], &marked).unwrap();
    let rebuilt = ProbeCache::at(&dir, "build B");
    assert!(!compile(&rebuilt, 0x3000_0000_1000, &config)
        .ptx
        .contains("_from_disk"));
    // A file whose stored inputs differ from the asked ones (a hash collision, a torn
    // write) is not an answer.
    let key_end = marked.find('\0').unwrap();
    let wrong = format!("{}x{}", &marked[..key_end], &marked[key_end..]);
    std::fs::write(&files[0], wrong).unwrap();
    let fresh = compile(&cache, 0x3000_0000_1000, &config);
    assert!(!fresh.ptx.contains("_from_disk"));
    assert_eq!(fresh, first);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_probe_is_the_same_text_in_every_process() {
    // The process's pid is read from device memory, not written into the code: two runs
    // of a tool with their maps at the same addresses compile to the same PTX, which is
    // what lets the driver's JIT cache answer the second.
    let dir = std::env::temp_dir().join(format!("bpftime-probe-same-{}", std::process::id()));
    let cache = ProbeCache::at(&dir, "build");
    let _ = std::fs::remove_dir_all(&dir);
    let config = RuntimeConfig {
        pid_tgid_at: 0x3000_0000_0000,
        trace_ring: 0,
        shards: vec![],
    };
    let insns = assemble("call 14\nexit").unwrap();
    let compiled = |cache: Option<&ProbeCache>| {
        compile_probe_cached(
            cache,
            ProbePoint::Entry,
            &insns,
            &HashMap::new(),
            &config,
            90,
            "__bpftime_probe_1",
        )
        .unwrap()
    };
    let (a, b) = (compiled(None), compiled(Some(&cache)));
    assert_eq!(a, b);
    assert!(a.ptx.contains("ld.global.u64"), "{}", a.ptx);
    assert!(
        a.ptx.contains(&0x3000_0000_0000u64.to_string()),
        "{}",
        a.ptx
    );
    let _ = std::fs::remove_dir_all(&dir);
}
