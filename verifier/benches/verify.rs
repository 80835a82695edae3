//! Verification time of a few program shapes (`cargo bench -p bpftime-verifier`).
//! Plain timing loop: the workspace carries no benchmark framework.

use std::hint::black_box;
use std::time::Instant;

use bpftime_isa::asm::assemble;
use bpftime_isa::uapi::{map_type, prog_type};
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo};

fn maps(fd: i32) -> Option<MapDesc> {
    (fd == 1).then_some(MapDesc {
        map_type: map_type::ARRAY,
        key_size: 4,
        value_size: 64,
        max_entries: 1,
        flags: 0,
        ..MapDesc::default()
    })
}

fn bench(name: &str, src: &str) {
    let insns = assemble(src).unwrap();
    let info = ProgramInfo {
        insns: &insns,
        prog_type: prog_type::KPROBE,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    let opts = Options::default();
    let stats = verify(&info, &opts).unwrap();
    let iters = (200_000 / stats.insns_processed.max(1)).clamp(3, 10_000);
    let t = Instant::now();
    for _ in 0..iters {
        black_box(verify(black_box(&info), &opts).unwrap());
    }
    let per = t.elapsed() / iters as u32;
    println!(
        "{name:<28} {:>6} insns {:>9} processed {:>6} states {:>12?}/verify {:>8.1} ns/insn",
        insns.len(),
        stats.insns_processed,
        stats.states,
        per,
        per.as_nanos() as f64 / stats.insns_processed as f64
    );
}

fn main() {
    let straight: String = (0..4000)
        .map(|k| format!("mov %r{}, {k}\n", k % 5))
        .collect();
    bench("straight line 4k", &(straight + "mov %r0, 0\nexit"));

    let diamonds: String = (0..1000)
        .map(|_| "ldxdw %r2, [%r1]\njeq %r2, 0, +1\nmov %r3, 1\nmov %r4, 2\nmov %r5, 3\n")
        .collect();
    bench("1000 diamonds", &(diamonds + "mov %r0, 0\nexit"));

    bench(
        "bounded loop x10000",
        "mov %r0, 0\nmov %r1, 0\nloop:\nadd %r0, 3\nadd %r1, 1\njlt %r1, 10000, loop\nexit",
    );

    let stack: String = (1..=64)
        .map(|k| format!("stdw [%r10-{}], {k}\n", k * 8))
        .collect::<String>()
        + &(1..=64)
            .map(|k| format!("ldxdw %r2, [%r10-{}]\nadd %r0, %r2\n", k * 8))
            .collect::<String>();
    bench("stack 64 slots", &format!("mov %r0, 0\n{stack}exit"));
}
