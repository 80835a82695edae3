//! Measures interpreter throughput on a tight loop of ALU, memory and branch instructions,
//! in the unchecked mode traced processes use and in the checked mode.
//!
//! `cargo run --release -p bpftime-interpreter --example throughput`

use std::time::Instant;

use bpftime_interpreter::{execute, MemoryPolicy, NoEnvironment};
use bpftime_isa::asm::assemble;

fn main() {
    let iterations: u64 = 10_000_000;
    // Eight instructions per iteration: a stack store and load, ALU, and the loop branch.
    let prog = assemble(&format!(
        "mov %r0, 0\nmov %r3, 0\nloop:\nstxdw [%r10-8], %r3\nldxdw %r4, [%r10-8]\nadd %r0, %r4\n\
         xor %r0, 0x55\nlsh %r4, 1\nadd %r0, %r4\nadd %r3, 1\njlt %r3, {iterations}, loop\nexit"
    ))
    .expect("the benchmark program assembles");
    let insns = iterations * 8 + 3;

    // SAFETY: the program touches only its own stack.
    let unchecked = unsafe { MemoryPolicy::unchecked() };
    let checked = MemoryPolicy::checked([]);
    for (name, policy) in [("unchecked", &unchecked), ("checked", &checked)] {
        let start = Instant::now();
        let r0 = execute(&prog, 0, 0, &NoEnvironment, policy).expect("the benchmark runs");
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{name:>9}: {:.2} ns/insn, {:.0} M insn/s (r0 = {r0:#x})",
            secs * 1e9 / insns as f64,
            insns as f64 / secs / 1e6
        );
    }

    // A run of a tiny program measures the fixed cost of one call.
    let tiny = assemble("mov %r0, %r1\nadd %r0, 1\nexit").expect("assembles");
    let runs = 1_000_000u64;
    let start = Instant::now();
    let mut acc = 0u64;
    for i in 0..runs {
        acc = acc.wrapping_add(execute(&tiny, i, 0, &NoEnvironment, &unchecked).unwrap_or(0));
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "per-run overhead (3-insn program, unchecked): {:.1} ns (acc {acc})",
        secs * 1e9 / runs as f64
    );
}
