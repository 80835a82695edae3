//! Runs every bpf_conformance `.data` file on every engine and fails on any failure that is
//! not excluded below with a reason.

use bpftime_conformance::{
    check, default_suite_dir, parse_test, suite_files, test_name, Engine, InterpreterEngine,
    JitEngine,
};
use bpftime_jit_x86::JitOptions;

/// Tests an engine is known to fail, with why. The interpreter has none: keep it that way.
const INTERPRETER_EXCLUSIONS: &[(&str, &str)] = &[];
/// The x86-64 JIT has none either, at any optimization setting.
const JIT_EXCLUSIONS: &[(&str, &str)] = &[];

fn run_suite(engine: &dyn Engine, exclusions: &[(&str, &str)]) {
    let files = suite_files(&default_suite_dir()).unwrap_or_else(|e| panic!("{e}"));

    let (mut passed, mut failed, mut excluded) = (0, Vec::new(), Vec::new());
    for path in &files {
        let name = test_name(path);
        let text = std::fs::read_to_string(path).expect("reading a .data file");
        let outcome = parse_test(&name, &text)
            .map_err(|e| e.to_string())
            .and_then(|case| check(engine, &case).map_err(|e| e.to_string()));
        let reason = exclusions.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
        match (outcome, reason) {
            (Ok(()), None) => passed += 1,
            (Ok(()), Some(_)) => {
                // An excluded test that passes means the exclusion is stale.
                println!("FAIL {name}: passes but is excluded; remove the exclusion");
                failed.push(name);
            }
            (Err(e), Some(r)) => {
                println!("excluded {name}: {e} (because: {r})");
                excluded.push(name);
            }
            (Err(e), None) => {
                println!("FAIL {name}: {e}");
                failed.push(name);
            }
        }
    }
    for (n, _) in exclusions {
        assert!(
            files.iter().any(|p| p.file_stem().is_some_and(|s| s == *n)),
            "exclusion `{n}` names no test"
        );
    }
    println!(
        "{}: {passed} passed, {} failed, {} excluded{}",
        engine.name(),
        failed.len(),
        excluded.len(),
        if excluded.is_empty() {
            String::new()
        } else {
            format!(" ({})", excluded.join(", "))
        }
    );
    assert!(
        failed.is_empty(),
        "{} failed: {}",
        engine.name(),
        failed.join(", ")
    );
}

#[test]
fn interpreter_passes_bpf_conformance() {
    run_suite(&InterpreterEngine, INTERPRETER_EXCLUSIONS);
}

#[test]
fn jit_passes_bpf_conformance_at_every_optimization_setting() {
    // The default is what probes attach with; O2 and the fastest compile take other paths
    // through LLVM's optimizer and instruction selection.
    for engine in [
        JitEngine::default(),
        JitEngine::new("jit (O2)", JitOptions::optimized()),
        JitEngine::new("jit (fastest)", JitOptions::fastest()),
    ] {
        run_suite(&engine, JIT_EXCLUSIONS);
    }
}

#[test]
fn gpu_passes_bpf_conformance() {
    // Needs an NVIDIA GPU and its driver. Without one (CI) this says why and returns;
    // gpu_codegen.rs still checks every program's PTX with ptxas there, and
    // scripts/gpu.sh runs this suite on a GPU machine.
    if let Err(why) = bpftime_conformance::gpu::check_libcuda() {
        eprintln!("not running the gpu engine: {why}");
        return;
    }
    run_suite(&bpftime_conformance::gpu::GpuEngine::new(), &[]);
}
