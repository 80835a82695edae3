//! Rejection logs as golden files: a change in wording or register rendering is a
//! reviewed diff. `BPFTIME_BLESS=1 cargo test -p bpftime-verifier --test golden` rewrites them.

mod common;

use std::path::Path;

use common::*;

fn golden(name: &str, src: &str) {
    let log = match run(src) {
        Ok(v) => format!("accepted, processed {} insns\n", v.insns_processed),
        Err(e) => e.log(),
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.log"));
    bpftime_golden::assert_golden(&path, &log);
}

#[test]
fn ctx_out_of_bounds() {
    golden("ctx_out_of_bounds", "mov %r0, 0\nldxw %r2, [%r1+200]\nexit");
}

#[test]
fn null_deref() {
    golden(
        "null_deref",
        "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 1\ncall 1\nldxdw %r0, [%r0]\nexit",
    );
}

#[test]
fn map_value_variable_offset() {
    golden(
        "map_value_variable_offset",
        "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 2\ncall 1\njeq %r0, 0, +5\nldxdw %r1, [%r0]\nand %r1, 31\nadd %r0, %r1\nldxb %r0, [%r0]\nexit\nmov %r0, 0\nexit",
    );
}

#[test]
fn ringbuf_leak() {
    golden(
        "ringbuf_leak",
        "ldmap %r1, 3\nmov %r2, 16\nmov %r3, 0\ncall 131\njeq %r0, 0, +1\nstdw [%r0], 1\nmov %r0, 0\nexit",
    );
}

#[test]
fn uninit_stack_reads_as_a_number() {
    golden(
        "uninit_stack_number",
        "stw [%r10-8], 1\nldxdw %r1, [%r10-8]\nldxdw %r0, [%r1]\nexit",
    );
}
