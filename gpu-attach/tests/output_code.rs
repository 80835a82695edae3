//! What a probe's ring buffer and perf event output become on the GPU (kernelretsnoop,
//! clang-built, both ways), spliced into nvcc's vectorAdd at its exits: the record
//! reaches the out-of-line writer as words in registers, so the probe keeps no stack
//! frame, and ptxas (where it is found) takes the module.

mod support;

use support::{clang_program, vector_add_with};

use bpftime_gpu_probe::compile_probe;
use bpftime_gpu_ptx::ptx::ProbePoint;

const SYMBOL: &str = "__bpftime_probe_4";

/// Compiles kernelretsnoop's exit probe from `object` and splices it into vectorAdd;
/// returns the probe's own body.
fn exit_probe(object: &str, tag: &str) -> String {
    let (insns, maps, config) = clang_program(object, "cuda:vectorAdd:exit", &[], 0x3000_0010_0000);
    let probe = compile_probe(ProbePoint::Exit, &insns, &maps, &config, 90, SYMBOL)
        .expect("kernelretsnoop's probe compiles");
    let head = format!(".visible .func  (.param .b64 func_retval0) {SYMBOL}(");
    let body = &probe.ptx[probe.ptx.find(&head).expect("the probe function")..];
    let own = body[..body.find("\n}").expect("the probe's end")].to_string();

    vector_add_with(&probe.ptx, SYMBOL, ProbePoint::Exit, tag);
    own
}

/// The 24-byte record (4 words at most) goes to the small writer, by value: no
/// `__local_depot` in the probe, no generic address of one.
#[test]
fn ring_and_perf_records_reach_their_writers_in_registers() {
    for (object, writer, tag) in [
        (
            bpftime_bpf_examples::KERNELRETSNOOP_BPF_O,
            "ringbuf_output_small",
            "kretsnoop-ring",
        ),
        (
            bpftime_bpf_examples::KERNELRETSNOOP_PERF_BPF_O,
            "perf_event_output_small",
            "kretsnoop-perf",
        ),
    ] {
        let body = exit_probe(object, tag);
        assert!(
            body.contains(&format!("{SYMBOL}__{writer}")),
            "{object}: no call of the small writer:\n{body}"
        );
        assert!(!body.contains("__local_depot"), "{object}:\n{body}");
        assert!(!body.contains("cvta.local"), "{object}:\n{body}");
    }
}
