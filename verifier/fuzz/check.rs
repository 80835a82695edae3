//! The fuzz target's body, shared with the stable test suite
//! (`tests/fuzz_inputs.rs` runs it over deterministic inputs, so CI without
//! nightly or libFuzzer exercises it too).
//!
//! Input layout: byte 0 picks the program type, GPU mode, map set and log
//! level; byte 1 is the conformance buffer's length; the rest, cut to whole
//! 8-byte slots, is the program. The verifier must answer every input without
//! panicking, within its complexity limit, and a rejection must render its log.

use bpftime_isa::uapi::{map_type as mt, prog_type};
use bpftime_isa::{Insn, INSN_SIZE};
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, PROG_TYPE_CONFORMANCE};

/// Processed instructions allowed per input: bounds the work on any program.
pub const MAX_PROCESSED: u64 = 100_000;

fn desc(map_type: u32, key_size: u32, value_size: u32, max_entries: u32) -> MapDesc {
    MapDesc {
        map_type,
        key_size,
        value_size,
        max_entries,
        flags: 0,
        ..MapDesc::default()
    }
}

/// Four map sets, by fd (0-based, as the corpus numbers them).
pub fn map(set: u8, fd: i32) -> Option<MapDesc> {
    let d = match (set, fd) {
        (0, _) => return None,
        (1, 0) => desc(mt::HASH, 4, 8, 64),
        (1, 1) => desc(mt::ARRAY, 4, 64, 16),
        (1, 2) => desc(mt::RINGBUF, 0, 0, 4096),
        (1, 3) => desc(mt::PERF_EVENT_ARRAY, 4, 4, 64),
        (1, 4) => desc(mt::ARRAY, 4, 16, 1),
        (2, 0) => desc(mt::GPU_ARRAY, 4, 8, 1),
        (2, 1) => desc(mt::GPU_HASH, 8, 16, 64),
        (2, 2) => desc(mt::GPU_RINGBUF, 0, 0, 4096),
        (2, 3) => desc(mt::PROG_ARRAY, 4, 4, 8),
        (2, 4) => desc(mt::QUEUE, 0, 8, 16),
        (3, 0) => desc(mt::ARRAY, 4, 1, 1),
        (3, 1) => desc(mt::HASH, 1, 1 << 20, 1),
        (3, 2) => desc(mt::STACK_TRACE, 4, 1016, 8),
        (3, 3) => desc(mt::LRU_PERCPU_HASH, 512, 512, 2),
        (3, 4) => desc(mt::BLOOM_FILTER, 0, 8, 8),
        _ => return None,
    };
    Some(d)
}

/// Verifies one input; panics only where the verifier misbehaves.
pub fn check(data: &[u8]) {
    let (Some(&sel), Some(&mem_len)) = (data.first(), data.get(1)) else {
        return;
    };
    let body = &data[2..];
    let insns: Vec<Insn> = body
        .chunks_exact(INSN_SIZE)
        .map(|c| Insn::from_bytes(c.try_into().expect("chunks are whole slots")))
        .collect();
    let set = (sel >> 2) & 3;
    let info = ProgramInfo {
        insns: &insns,
        prog_type: if sel & 1 == 0 {
            prog_type::KPROBE
        } else {
            PROG_TYPE_CONFORMANCE
        },
        gpu: sel & 2 != 0,
        maps: &|fd| map(set, fd),
        mem_len: u32::from(mem_len),
    };
    let opts = Options {
        max_processed: MAX_PROCESSED,
        log_level: u32::from(sel >> 6),
        max_log_bytes: 1 << 16,
        ..Options::default()
    };
    match verify(&info, &opts) {
        Ok(v) => {
            assert!(
                v.insns_processed <= MAX_PROCESSED,
                "accepted after {} insns, past the limit",
                v.insns_processed
            );
            assert!(v.stack_depth <= 512, "stack depth {}", v.stack_depth);
        }
        Err(e) => {
            let log = e.log();
            assert!(!log.is_empty(), "a rejection without a log");
            assert!(
                insns.is_empty() || e.insn < insns.len(),
                "rejection at insn {} of a {}-insn program",
                e.insn,
                insns.len()
            );
        }
    }
}
