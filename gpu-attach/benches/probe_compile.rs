//! How long LLVM takes to make a GPU probe's PTX, the part of "module load to instrumented
//! module ready" that is ours on a first run (the rest is the driver's JIT): an empty exit
//! probe, and a counter in an inlined array map that also reads the clock. No GPU needed.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use bpftime_gpu_attach::device_maps::RuntimeConfig;
use bpftime_gpu_attach::probe::{compile_probe, DeviceMapRef};
use bpftime_gpu_attach::ProbePoint;
use bpftime_isa::asm::assemble;
use bpftime_isa::Insn;
use bpftime_jit_ptx::ArrayMapLayout;
use criterion::{criterion_group, criterion_main, Criterion};

const MAP: u32 = 2;
const DESC: u64 = 0x3000_0000_1000;

fn counter() -> Vec<Insn> {
    let mut insns = assemble(
        "stw [%r10-4], 0\nlddw %r1, 2\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, +4\n\
         mov %r1, 1\nlock add [%r0+0], %r1\ncall 5\nstxdw [%r10-16], %r0\nmov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && insn.imm == MAP as i32 {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    insns
}

fn bench(c: &mut Criterion) {
    let array = ArrayMapLayout {
        values: DESC + 0x100,
        key_stride: 8,
        max_entries: 4,
        update_size: 8,
        per_cpu: None,
    };
    let maps: HashMap<u32, DeviceMapRef> = [(
        MAP,
        DeviceMapRef {
            desc: DESC,
            values: Some(array.values),
            array: Some(array),
        },
    )]
    .into_iter()
    .collect();
    let config = RuntimeConfig {
        pid_tgid_at: 0x3000_0000_0000,
        trace_ring: 0x3000_0000_0100,
        shards: vec![],
    };
    let empty = assemble("mov %r0, 0\nexit").expect("assembles");
    let counter = counter();
    let mut g = c.benchmark_group("gpu_probe_compile");
    g.measurement_time(Duration::from_secs(5));
    for (name, insns) in [("empty", &empty), ("array_counter_and_clock", &counter)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(
                    compile_probe(
                        ProbePoint::Exit,
                        insns,
                        &maps,
                        &config,
                        90,
                        "__bpftime_probe_0",
                    )
                    .expect("compiles"),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
