//! Shared helpers: assemble uBPF text with two extra pseudo-mnemonics and verify it.
//!
//! `ldmap %rN, FD` and `ldmapval %rN, FD, OFF` become `lddw` with a map source;
//! `ldfunc %rN, REL` becomes `lddw` naming the subprogram `REL` slots after the next one.

#![allow(dead_code)] // each test binary uses a different part of this module

use bpftime_isa::asm::assemble;
use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{map_type as mt, prog_type};
use bpftime_isa::Insn;
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, Rejection, Verified};

pub const HASH: i32 = 1;
pub const ARRAY: i32 = 2;
pub const RINGBUF: i32 = 3;
pub const PERF: i32 = 4;
pub const PROGS: i32 = 5;
pub const QUEUE: i32 = 6;
pub const GPU_ARRAY: i32 = 7;
pub const STACK_TRACE: i32 = 8;
pub const MAP_OF_MAPS: i32 = 9;
pub const LRU: i32 = 10;
/// A single-element array, as global data (`.rodata`, `.bss`) is.
pub const GLOBAL: i32 = 11;
/// bpftime's GPU maps, as its examples declare them.
pub const GPU_RINGBUF: i32 = 12;
pub const PER_THREAD: i32 = 13;
pub const GPU_HASH: i32 = 14;
pub const GPU_KERNEL_SHARED: i32 = 15;
pub const PER_THREAD_HOST: i32 = 16;
pub const GPU_ARRAY_HOST: i32 = 17;

pub fn maps(fd: i32) -> Option<MapDesc> {
    let d = |map_type, key_size, value_size| MapDesc {
        map_type,
        key_size,
        value_size,
        max_entries: 64,
        flags: 0,
        ..MapDesc::default()
    };
    Some(match fd {
        HASH => d(mt::HASH, 4, 8),
        ARRAY => d(mt::ARRAY, 4, 16),
        RINGBUF => d(mt::RINGBUF, 0, 0),
        PERF => d(mt::PERF_EVENT_ARRAY, 4, 4),
        PROGS => d(mt::PROG_ARRAY, 4, 4),
        QUEUE => d(mt::QUEUE, 0, 8),
        GPU_ARRAY => d(mt::GPU_ARRAY, 4, 8),
        STACK_TRACE => d(mt::STACK_TRACE, 4, 64),
        MAP_OF_MAPS => d(mt::ARRAY_OF_MAPS, 4, 4),
        LRU => d(mt::LRU_HASH, 8, 32),
        GPU_RINGBUF => d(mt::GPU_RINGBUF, 4, 24),
        PER_THREAD => d(mt::GPU_PER_THREAD_ARRAY, 4, 8),
        GPU_HASH => d(mt::GPU_HASH, 4, 8),
        GPU_KERNEL_SHARED => d(mt::GPU_KERNEL_SHARED_ARRAY, 4, 8),
        PER_THREAD_HOST => d(mt::GPU_PER_THREAD_ARRAY_HOST, 4, 8),
        GPU_ARRAY_HOST => d(mt::GPU_ARRAY_HOST, 4, 8),
        // The inner maps of MAP_OF_MAPS are hashes like HASH.
        _ if bpftime_verifier::inner_map_owner(fd) == Some(MAP_OF_MAPS) => d(mt::HASH, 4, 8),
        GLOBAL => MapDesc {
            max_entries: 1,
            ..d(mt::ARRAY, 4, 16)
        },
        _ => return None,
    })
}

enum Tag {
    Plain,
    Map(u8, i32),
    Func(i32),
}

pub fn asm(src: &str) -> Vec<Insn> {
    let mut tags = Vec::new();
    let mut text = String::new();
    for line in src.lines() {
        let t = line.trim();
        let (m, rest) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
        let ops: Vec<&str> = rest.split(',').map(str::trim).collect();
        let num = |s: &str| s.parse::<i64>().unwrap();
        match m {
            "ldmap" => {
                tags.push(Tag::Map(op::PSEUDO_MAP_FD, num(ops[1]) as i32));
                text.push_str(&format!("lddw {}, 0\n", ops[0]));
            }
            "ldmapval" => {
                tags.push(Tag::Map(op::PSEUDO_MAP_VALUE, num(ops[1]) as i32));
                text.push_str(&format!("lddw {}, {}\n", ops[0], num(ops[2]) << 32));
            }
            "ldfunc" => {
                tags.push(Tag::Func(num(ops[1]) as i32));
                text.push_str(&format!("lddw {}, 0\n", ops[0]));
            }
            "lddw" => {
                tags.push(Tag::Plain);
                text.push_str(t);
                text.push('\n');
            }
            _ => {
                text.push_str(t);
                text.push('\n');
            }
        }
    }
    let mut insns = assemble(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut tags = tags.into_iter();
    let mut pc = 0;
    while pc < insns.len() {
        if insns[pc].is_lddw() {
            match tags.next().unwrap() {
                Tag::Plain => {}
                Tag::Map(src, fd) => {
                    insns[pc].src = src;
                    insns[pc].imm = fd;
                }
                Tag::Func(rel) => {
                    insns[pc].src = op::PSEUDO_FUNC;
                    insns[pc].imm = rel;
                }
            }
            pc += 2;
        } else {
            pc += 1;
        }
    }
    insns
}

pub fn run_with(insns: &[Insn], prog_type: u32, gpu: bool) -> Result<Verified, Rejection> {
    let info = ProgramInfo {
        insns,
        prog_type,
        gpu,
        maps: &maps,
        mem_len: 64,
    };
    let r = verify(&info, &Options::default());
    dump(insns, prog_type, gpu, &r);
    r
}

/// With `BPFTIME_VERIFIER_DUMP=dir`, every program and our verdict land in `dir`, for
/// comparing against the kernel's verifier (the oracle docs/ARCHITECTURE.md names).
fn dump(insns: &[Insn], prog_type: u32, gpu: bool, r: &Result<Verified, Rejection>) {
    let Some(dir) = std::env::var_os("BPFTIME_VERIFIER_DUMP") else {
        return;
    };
    let bytes = bpftime_isa::encode(insns);
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let verdict = match r {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("{:?}", e.kind)
            .split([' ', '{'])
            .next()
            .unwrap_or("")
            .to_string(),
    };
    let name = format!("{hash:016x}.{prog_type}.{}.{verdict}.bin", gpu as u8);
    let _ = std::fs::write(std::path::Path::new(&dir).join(name), bytes);
}

pub fn run(src: &str) -> Result<Verified, Rejection> {
    run_with(&asm(src), prog_type::KPROBE, false)
}

#[track_caller]
pub fn ok(src: &str) -> Verified {
    match run(src) {
        Ok(v) => v,
        Err(e) => panic!("expected acceptance, got:\n{}", e.log()),
    }
}

#[track_caller]
pub fn bad(src: &str) -> Rejection {
    match run(src) {
        Ok(v) => panic!(
            "expected rejection, verified after {} insns",
            v.insns_processed
        ),
        Err(e) => e,
    }
}
