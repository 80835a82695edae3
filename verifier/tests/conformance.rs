//! Every bpf_conformance program verifies under `PROG_TYPE_CONFORMANCE`, with the
//! test's own memory as the context, except those unsafe by design, each named
//! below with its reason. An excluded program that verifies fails the test too,
//! so the list cannot go stale.

use std::path::PathBuf;

use bpftime_isa::asm::assemble;
use bpftime_verifier::{verify, Options, ProgramInfo, PROG_TYPE_CONFORMANCE};

/// Programs the verifier must refuse, and why. None of the suite's programs is
/// unsafe: division by zero and shifts past the width are defined by the ISA
/// (the conformance program type allows them), every memory access stays in the
/// test's buffer or the stack, every loop is bounded, and the only helper called
/// (5, through `call` and `callx` with a known register) exists.
const UNSAFE_BY_DESIGN: &[(&str, &str)] = &[];

fn conformance_dir() -> PathBuf {
    match std::env::var_os("BPF_CONFORMANCE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/conformance/bpf_conformance"),
    }
}

/// The `-- asm` text and the `-- mem` bytes of a `.data` file.
fn parse(text: &str) -> (String, Vec<u8>) {
    let mut section = "";
    let (mut asm, mut mem) = (String::new(), Vec::new());
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("--") {
            section = h.trim();
            continue;
        }
        match section {
            "asm" => {
                asm.push_str(line);
                asm.push('\n');
            }
            "mem" => {
                let data = line.split('#').next().unwrap_or("");
                for tok in data.split_whitespace() {
                    mem.push(u8::from_str_radix(tok, 16).expect("a hex byte in -- mem"));
                }
            }
            _ => {}
        }
    }
    (asm, mem)
}

#[test]
fn every_conformance_program_verifies_unless_unsafe_by_design() {
    let dir = conformance_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "cannot read the bpf_conformance tests at {} ({e}); set BPF_CONFORMANCE_DIR",
                dir.display()
            )
        })
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "data"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 300,
        "only {} .data files in {}",
        files.len(),
        dir.display()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (asm, mem) = parse(&std::fs::read_to_string(path).unwrap());
        let insns = assemble(&asm).unwrap_or_else(|e| panic!("{name}: {e}"));
        let info = ProgramInfo {
            insns: &insns,
            prog_type: PROG_TYPE_CONFORMANCE,
            gpu: false,
            maps: &|_| None,
            mem_len: mem.len() as u32,
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
