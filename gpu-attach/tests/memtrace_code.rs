//! What memtrace's memory-access probe (the clang-built `bpf-examples` object) becomes on
//! the GPU, compiled as a session compiles it (its arrays in the context's shard window)
//! and spliced into nvcc's vectorAdd: the work it adds to every access, which decides
//! its overhead, read from the PTX; and the spliced module checked by NVIDIA's `ptxas`
//! where it is found (as `splice.rs` finds it).

mod support;

use support::{clang_program, vector_add_with};

use bpftime_gpu_probe::compile_probe;
use bpftime_gpu_ptx::ptx::ProbePoint;

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
    let (insns, maps, config) = clang_program(
        bpftime_bpf_examples::MEMTRACE_BPF_O,
        "cuda:*:ldst",
        ARRAYS,
        WINDOW,
    );
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

    let spliced = vector_add_with(&probe.ptx, SYMBOL, ProbePoint::Access, "memtrace-vectorAdd");
    let kernel_text = &spliced[spliced.find(".entry _Z9vectorAdd").expect("vectorAdd")..];
    assert_eq!(kernel_text.matches("%smid").count(), 1, "{kernel_text}");
}
