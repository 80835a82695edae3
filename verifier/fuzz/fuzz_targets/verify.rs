//! Any byte string, as a program of each supported type, CPU and GPU: the verifier
//! must answer without panicking, and a rejection must render its log.
#![no_main]

use bpftime_isa::uapi::{map_type, prog_type};
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, PROG_TYPE_CONFORMANCE};
use libfuzzer_sys::fuzz_target;

fn maps(fd: i32) -> Option<MapDesc> {
    let d = |map_type, key_size, value_size| MapDesc {
        map_type,
        key_size,
        value_size,
        max_entries: 16,
        flags: 0,
    };
    Some(match fd {
        1 => d(map_type::HASH, 4, 8),
        2 => d(map_type::ARRAY, 4, 64),
        3 => d(map_type::RINGBUF, 0, 0),
        4 => d(map_type::PERF_EVENT_ARRAY, 4, 4),
        _ => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let Ok(insns) = bpftime_isa::decode(body) else {
        return;
    };
    let prog_type = if sel & 1 == 0 {
        prog_type::KPROBE
    } else {
        PROG_TYPE_CONFORMANCE
    };
    let info = ProgramInfo {
        insns: &insns,
        prog_type,
        gpu: sel & 2 != 0,
        maps: &maps,
        mem_len: 64,
    };
    let opts = Options {
        max_processed: 100_000,
        log_level: u32::from(sel >> 6),
        ..Options::default()
    };
    if let Err(e) = verify(&info, &opts) {
        let _ = e.log();
    }
});
