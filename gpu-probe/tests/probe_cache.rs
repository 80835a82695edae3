//! GPU probes compiled once are answered from the on-disk cache in later runs: the same
//! inputs give the stored PTX, and any input that differs (or another build of bpftime)
//! compiles afresh.

use std::collections::HashMap;

#[path = "support/counter_probe.rs"]
mod counter_probe;

use counter_probe::{counter, maps};

use bpftime_gpu_device::device_maps::RuntimeConfig;
use bpftime_gpu_probe::{CachedProbe, DeviceMapRef, ProbeCache, ProbeCompiler};
use bpftime_gpu_ptx::ProbePoint;
use bpftime_isa::asm::assemble;

/// A compiler of its own each time, as a later run has: what it answers comes from the
/// disk, or from LLVM.
fn compile(cache: &ProbeCache, desc: u64, config: &RuntimeConfig) -> CachedProbe {
    ProbeCompiler::new(Some(cache.clone()))
        .compile(
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
    const MARK: &str = "// read from the disk";
    let marked = format!("{stored}\n{MARK}\n");
    std::fs::write(&files[0], &marked).unwrap();
    let again = compile(&cache, 0x3000_0000_1000, &config);
    assert!(again.ptx.contains(MARK));
    assert_eq!(again.ptx.replace(&format!("\n{MARK}\n"), ""), first.ptx);
    assert_eq!(again.clock_offset, first.clock_offset);
    // The same code spliced under another name (another place in another module) is
    // the same file, named as asked.
    let renamed = ProbeCompiler::new(Some(cache.clone()))
        .compile(
            ProbePoint::Exit,
            &counter(),
            &maps(0x3000_0000_1000),
            &config,
            90,
            "__bpftime_probe_7",
        )
        .unwrap();
    assert!(renamed.ptx.contains(MARK));
    assert!(!renamed.ptx.contains("__bpftime_probe_3"));
    assert_eq!(
        renamed
            .ptx
            .replace("__bpftime_probe_7", "__bpftime_probe_3"),
        again.ptx
    );
    assert_eq!(
        renamed.clock_offset.as_deref(),
        Some("__bpftime_probe_7__clock_offset_ns")
    );
    assert_eq!(probes_in(&dir).len(), 1);
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
    let same = ProbeCompiler::new(Some(cache.clone()))
        .compile(
            ProbePoint::Exit,
            &renumbered,
            &by_other_id,
            &config,
            90,
            "__bpftime_probe_3",
        )
        .unwrap();
    assert!(same.ptx.contains(MARK));
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
        .contains(MARK));
    std::fs::write(&files[0], &marked).unwrap();
    let rebuilt = ProbeCache::at(&dir, "build B");
    assert!(!compile(&rebuilt, 0x3000_0000_1000, &config)
        .ptx
        .contains(MARK));
    // A file whose stored inputs differ from the asked ones (a hash collision, a torn
    // write) is not an answer.
    let key_end = marked.find('\0').unwrap();
    let wrong = format!("{}x{}", &marked[..key_end], &marked[key_end..]);
    std::fs::write(&files[0], wrong).unwrap();
    let fresh = compile(&cache, 0x3000_0000_1000, &config);
    assert!(!fresh.ptx.contains(MARK));
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
        ProbeCompiler::new(cache.cloned())
            .compile(
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

#[test]
fn a_probe_asked_for_from_several_threads_at_once_is_compiled_once() {
    // Modules loaded at once by several threads, the same probe in each: one compiles,
    // the others wait for its work and get it under their own names.
    let compiler = ProbeCompiler::new(None);
    let config = RuntimeConfig {
        pid_tgid_at: 0x3000_0000_0000,
        trace_ring: 0x3000_0000_0100,
        shards: vec![],
    };
    let answers: Vec<CachedProbe> = std::thread::scope(|s| {
        let running: Vec<_> = (0..4)
            .map(|n| {
                let (compiler, config) = (&compiler, &config);
                s.spawn(move || {
                    compiler
                        .compile(
                            ProbePoint::Exit,
                            &counter(),
                            &maps(0x3000_0000_1000),
                            config,
                            90,
                            &format!("__bpftime_probe_{n}"),
                        )
                        .expect("compiles")
                })
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(compiler.compilations(), 1);
    for (n, answer) in answers.iter().enumerate() {
        let name = format!("__bpftime_probe_{n}");
        assert!(
            answer
                .ptx
                .contains(&format!(".func  (.param .b64 func_retval0) {name}(")),
            "{}",
            answer.ptx
        );
        assert_eq!(
            answer.ptx.replace(&name, "P"),
            answers[0].ptx.replace("__bpftime_probe_0", "P")
        );
    }
    // Other inputs are other code.
    compiler
        .compile(
            ProbePoint::Exit,
            &counter(),
            &maps(0x3000_0000_2000),
            &config,
            90,
            "__bpftime_probe_0",
        )
        .unwrap();
    assert_eq!(compiler.compilations(), 2);
}
