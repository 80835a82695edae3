//! Compile latency of a small tracing-like program (a uprobe that timestamps an event,
//! bumps a per-pid counter in a map and emits a record), per optimization setting.

use std::hint::black_box;
use std::time::Duration;

use bpftime_isa::opcode::*;
use bpftime_isa::Insn;
use bpftime_jit_x86::{JitCache, JitOptions, JitProgram, OptLevel};
use criterion::{criterion_group, criterion_main, Criterion};

extern "C" fn fake_helper(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

fn helpers(id: u32) -> Option<u64> {
    matches!(id, 1 | 2 | 5 | 14 | 25).then_some(fake_helper as *const () as u64)
}

const fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn::new(code, dst, src, off, imm)
}

/// 31 slots, shaped like what clang emits for a small uprobe counter.
fn tracing_program() -> Vec<Insn> {
    vec![
        i(ALU64 | MOV | X, 6, 1, 0, 0),            // r6 = ctx
        i(LDX | MEM | DW, 7, 6, 112, 0),           // r7 = ctx->di (first argument)
        i(JMP | CALL, 0, 0, 0, 14),                // get_current_pid_tgid
        i(ALU64 | RSH | K, 0, 0, 0, 32),           // pid
        i(STX | MEM | W, 10, 0, -4, 0),            // key on stack
        i(LD_DW_IMM, 1, PSEUDO_MAP_FD, 0, 0x1000), // map pointer (already resolved)
        i(0, 0, 0, 0, 0x7f00),
        i(ALU64 | MOV | X, 2, 10, 0, 0),
        i(ALU64 | ADD | K, 2, 0, 0, -4),
        i(JMP | CALL, 0, 0, 0, 1),    // map_lookup_elem
        i(JMP | JEQ | K, 0, 0, 4, 0), // miss: insert
        i(ALU64 | MOV | K, 1, 0, 0, 1),
        i(STX | ATOMIC | DW, 0, 1, 0, ATOMIC_ADD), // lock *(u64 *)r0 += 1
        i(JMP | JA, 0, 0, 0, 0),
        i(JMP | JA, 0, 0, 5, 0),
        i(ST | MEM | DW, 10, 0, -16, 1), // value = 1
        i(ALU64 | MOV | X, 3, 10, 0, 0),
        i(ALU64 | ADD | K, 3, 0, 0, -16),
        i(ALU64 | MOV | K, 4, 0, 0, 0),
        i(JMP | CALL, 0, 0, 0, 2),        // map_update_elem
        i(JMP | CALL, 0, 0, 0, 5),        // ktime_get_ns
        i(STX | MEM | DW, 10, 0, -32, 0), // event.ts
        i(STX | MEM | DW, 10, 7, -24, 0), // event.arg
        i(ALU64 | MOV | X, 1, 6, 0, 0),
        i(LD_DW_IMM, 2, PSEUDO_MAP_FD, 0, 0x2000), // perf map
        i(0, 0, 0, 0, 0x7f00),
        i(ALU64 | MOV | X, 4, 10, 0, 0),
        i(ALU64 | ADD | K, 4, 0, 0, -32),
        i(ALU64 | MOV | K, 5, 0, 0, 16),
        i(JMP | CALL, 0, 0, 0, 25), // perf_event_output
        i(ALU64 | MOV | K, 0, 0, 0, 0),
        i(JMP | EXIT, 0, 0, 0, 0),
    ]
}

fn compile_latency(c: &mut Criterion) {
    let prog = tracing_program();
    let mut group = c.benchmark_group("compile_tracing_32_slots");
    group.bench_function("default", |b| {
        let opts = JitOptions::default();
        b.iter(|| JitProgram::compile(black_box(&prog), &helpers, &opts).expect("compiles"))
    });
    for (name, opt_level, codegen_level) in [
        ("O2", OptLevel::O2, OptLevel::O2),
        ("O1", OptLevel::O1, OptLevel::O1),
        ("light_ir_O1_codegen", OptLevel::Light, OptLevel::O1),
        ("light_ir_fast_isel", OptLevel::Light, OptLevel::O0),
        ("O1_ir_fast_isel", OptLevel::O1, OptLevel::O0),
        ("O0_fast_isel", OptLevel::O0, OptLevel::O0),
    ] {
        let opts = JitOptions {
            opt_level,
            codegen_level,
            loop_free_codegen_level: None,
        };
        group.bench_function(name, |b| {
            b.iter(|| JitProgram::compile(black_box(&prog), &helpers, &opts).expect("compiles"))
        });
    }
    let cache = JitCache::new();
    let opts = JitOptions::default();
    cache
        .get_or_compile(&prog, &helpers, &opts)
        .expect("compiles");
    group.bench_function("cache_hit", |b| {
        b.iter(|| {
            cache
                .get_or_compile(black_box(&prog), &helpers, &opts)
                .expect("cached")
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = compile_latency
}
criterion_main!(benches);
