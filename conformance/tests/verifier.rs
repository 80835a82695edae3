//! Every bpf_conformance program verifies under `PROG_TYPE_CONFORMANCE`, with the
//! test's own memory as the context, except those unsafe by design, each named
//! below with its reason. An excluded program that verifies fails the test too,
//! so the list cannot go stale.

use bpftime_conformance::{default_suite_dir, parse_test, suite_files, test_name};
use bpftime_isa::asm::assemble;
use bpftime_verifier::{verify, Options, ProgramInfo, PROG_TYPE_CONFORMANCE};

/// Programs the verifier must refuse, and why. None of the suite's programs is
/// unsafe: division by zero and shifts past the width are defined by the ISA
/// (the conformance program type allows them), every memory access stays in the
/// test's buffer or the stack, every loop is bounded, and the only helper called
/// (5, through `call` and `callx` with a known register) exists.
const UNSAFE_BY_DESIGN: &[(&str, &str)] = &[];

#[test]
fn every_conformance_program_verifies_unless_unsafe_by_design() {
    let files = suite_files(&default_suite_dir()).unwrap_or_else(|e| panic!("{e}"));
    assert!(files.len() >= 300, "only {} .data files", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let name = test_name(path);
        let text = std::fs::read_to_string(path).expect("reading a .data file");
        let case = parse_test(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let insns = assemble(&case.asm).unwrap_or_else(|e| panic!("{name}: {e}"));
        let info = ProgramInfo {
            insns: &insns,
            prog_type: PROG_TYPE_CONFORMANCE,
            gpu: false,
            maps: &|_| None,
            mem_len: case.mem.len() as u32,
        };
        let verdict = verify(&info, &Options::default());
        let excluded = UNSAFE_BY_DESIGN.iter().find(|(n, _)| *n == name);
        match (verdict, excluded) {
            (Ok(_), None) | (Err(_), Some(_)) => {}
            (Ok(_), Some((_, why))) => failures.push(format!(
                "{name}: verifies, but is excluded as unsafe ({why})"
            )),
            (Err(e), None) => failures.push(format!("{name}: rejected:\n{}", e.log())),
        }
    }
    eprintln!(
        "{} conformance programs, {} excluded as unsafe by design",
        files.len(),
        UNSAFE_BY_DESIGN.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
