//! What the probes of `gpu_maps` (bpftime's GPU map types, spelled as bpftime's own GPU
//! programs spell them) become on the GPU, compiled as a session compiles them (its GPU
//! array `totals` laid out as an array in the shard window; the per-thread array, GPU hash
//! map and GPU ring buffer reached through their descriptors) and spliced into nvcc's
//! vectorAdd, each checked by NVIDIA's `ptxas` where it is found (as `splice.rs` finds it).

mod support;

use support::{clang_program, vector_add_with};

use bpftime_gpu_probe::compile_probe;
use bpftime_gpu_ptx::ptx::ProbePoint;

const SYMBOL: &str = "__bpftime_probe_12";
const WINDOW: u64 = 0x3000_0010_0000;

/// The probe `section` of gpu_maps, compiled and spliced at `point`: its own body, and
/// the whole module (the helpers it calls out of line too).
fn probe(section: &str, point: ProbePoint, tag: &str) -> (String, String) {
    let (insns, maps, config) = clang_program(
        bpftime_bpf_examples::GPU_MAPS_BPF_O,
        section,
        &[("totals", 4)],
        WINDOW,
    );
    let probe = compile_probe(point, &insns, &maps, &config, 90, SYMBOL)
        .unwrap_or_else(|e| panic!("{section}: {e}"));
    vector_add_with(&probe.ptx, SYMBOL, point, tag);
    let head = format!(".visible .func  (.param .b64 func_retval0) {SYMBOL}(");
    let body = &probe.ptx[probe.ptx.find(&head).expect("the probe function")..];
    (
        body[..body.find("\n}").expect("the probe's end")].to_string(),
        probe.ptx.clone(),
    )
}

/// The entry probe's per-thread array lookup and update find the thread's copy by its
/// global id over the whole grid (bpftime's numbering: the grid's and the block's sizes
/// in x and y, every index), and its GPU array adds go to the shard window as an array's
/// do; spliced into vectorAdd, ptxas takes it.
#[test]
fn per_thread_and_gpu_array_probes_compile_and_splice() {
    let (body, module) = probe("kprobe/vectorAdd", ProbePoint::Entry, "gpu-maps-entry");
    for register in [
        "%nctaid.x",
        "%nctaid.y",
        "%ntid.x",
        "%ntid.y",
        "%ntid.z",
        "%tid.z",
    ] {
        assert!(
            module.contains(register),
            "no {register} in the entry probe:\n{module}"
        );
    }
    // `totals` (a GPU array) is reached at its constant address in the window, as an
    // array's values are, not through a descriptor.
    assert!(body.contains(&format!("{WINDOW}")), "{body}");
}

/// The exit probe's bpf_perf_event_output on the GPU ring buffer (a NULL context, as
/// bpftime's kernelretsnoop passes) reaches a record writer with the 24-byte record in
/// registers, and the spliced module passes ptxas.
#[test]
fn a_gpu_ring_buffer_record_compiles_and_splices() {
    let (body, _) = probe("kretprobe/vectorAdd", ProbePoint::Exit, "gpu-maps-exit");
    assert!(
        body.contains(&format!("{SYMBOL}__perf_event_output_small")),
        "no call of the small writer:\n{body}"
    );
    assert!(!body.contains("__local_depot"), "{body}");
}
