//! How long LLVM takes to make a GPU probe's PTX, the part of "module load to instrumented
//! module ready" that is ours on a first run (the rest is the driver's JIT): an empty exit
//! probe, and a counter in an inlined array map that also reads the clock. No GPU needed.

use std::hint::black_box;
use std::time::Duration;

#[path = "../tests/support/counter_probe.rs"]
mod counter_probe;

use counter_probe::{counter, maps};

use bpftime_gpu_device::device_maps::RuntimeConfig;
use bpftime_gpu_probe::compile_probe;
use bpftime_gpu_ptx::ProbePoint;
use bpftime_isa::asm::assemble;
use criterion::{criterion_group, criterion_main, Criterion};

const DESC: u64 = 0x3000_0000_1000;

fn bench(c: &mut Criterion) {
    let maps = maps(DESC);
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
