use std::str::FromStr;
use std::sync::Arc;

use bpftime_interpreter::{execute, Environment, HelperFn, MemoryPolicy};
use bpftime_isa::asm::{assemble, AsmError};
use bpftime_isa::Insn;
use thiserror::Error;

use crate::data::{Expectation, TestCase};

/// Something that runs an eBPF program: the interpreter, and later the JIT and the GPU.
pub trait Engine {
    fn name(&self) -> &str;

    /// Runs `prog` with r1 pointing at `mem` and r2 holding its length; returns r0, or why
    /// the program was refused or stopped.
    fn run(&self, prog: &[Insn], mem: &mut [u8]) -> Result<u64, String>;
}

/// The engines a test run or the plugin can pick by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Interpreter,
    Jit,
    /// PTX on an NVIDIA GPU, one thread (see `crate::gpu`).
    Gpu,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown engine `{0}` (known: interpreter, jit, gpu)")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "interpreter" => Ok(EngineKind::Interpreter),
            "gpu" => Ok(EngineKind::Gpu),
            "jit" => Ok(EngineKind::Jit),
            other => Err(UnknownEngine(other.to_string())),
        }
    }
}

/// The interpreter, with memory checked against the test's buffer and the stack.
#[derive(Debug, Default, Clone, Copy)]
pub struct InterpreterEngine;

/// The helpers the bpf_conformance programs call.
struct ConformanceEnv;

/// The id of [`unwind`].
pub(crate) const UNWIND_HELPER: u32 = 5;

/// uBPF's test harness registers an `unwind` helper as id 5 that returns its first argument
/// (and unwinds the program when that is 0). `call_unwind_fail` and `callx` call it with a
/// non-zero argument, so only the returning half is needed.
pub(crate) unsafe extern "C" fn unwind(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

// SAFETY: the only helper touches no memory.
unsafe impl Environment for ConformanceEnv {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        (id == UNWIND_HELPER).then_some(unwind as HelperFn)
    }

    fn tail_call_target(&self, _map: u64, _index: u64) -> Option<Arc<[Insn]>> {
        None
    }
}

impl Engine for InterpreterEngine {
    fn name(&self) -> &str {
        "interpreter"
    }

    fn run(&self, prog: &[Insn], mem: &mut [u8]) -> Result<u64, String> {
        let start = mem.as_mut_ptr() as usize as u64;
        let len = mem.len() as u64;
        let policy = MemoryPolicy::checked(std::iter::once(start..start + len));
        execute(prog, start, len, &ConformanceEnv, &policy).map_err(|e| e.to_string())
    }
}

/// How a test case failed on an engine.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Mismatch {
    #[error("does not assemble: {0}")]
    Assemble(#[from] AsmError),
    #[error("assembles to {got} slots, `-- raw` has {expected}")]
    RawLength { got: usize, expected: usize },
    #[error("slot {slot} assembles to {got:#018x}, `-- raw` says {expected:#018x}")]
    RawSlot {
        slot: usize,
        got: u64,
        expected: u64,
    },
    #[error("{engine}: r0 = {got:#x}, expected {expected:#x}")]
    WrongResult {
        engine: String,
        got: u64,
        expected: u64,
    },
    #[error("{engine}: failed ({error}), expected r0 = {expected:#x}")]
    UnexpectedError {
        engine: String,
        error: String,
        expected: u64,
    },
    #[error("{engine}: returned {got:#x}, expected an error ({expected})")]
    MissingError {
        engine: String,
        got: u64,
        expected: String,
    },
}

/// Assembles `case`, checks it against its `-- raw` encoding if it has one, runs it on
/// `engine` over a copy of its memory and compares the outcome with the expectation.
pub fn check(engine: &dyn Engine, case: &TestCase) -> Result<(), Mismatch> {
    let prog = assemble(&case.asm)?;
    if let Some(raw) = &case.raw {
        if raw.len() != prog.len() {
            return Err(Mismatch::RawLength {
                got: prog.len(),
                expected: raw.len(),
            });
        }
        for (slot, (insn, &expected)) in prog.iter().zip(raw).enumerate() {
            let got = u64::from_le_bytes(insn.to_bytes());
            if got != expected {
                return Err(Mismatch::RawSlot {
                    slot,
                    got,
                    expected,
                });
            }
        }
    }
    let mut mem = case.mem.clone();
    let outcome = engine.run(&prog, &mut mem);
    let name = engine.name().to_string();
    match (&case.expect, outcome) {
        (Expectation::Value(expected), Ok(got)) if got == *expected => Ok(()),
        (Expectation::Value(expected), Ok(got)) => Err(Mismatch::WrongResult {
            engine: name,
            got,
            expected: *expected,
        }),
        (Expectation::Value(expected), Err(error)) => Err(Mismatch::UnexpectedError {
            engine: name,
            error,
            expected: *expected,
        }),
        (Expectation::Error(_), Err(_)) => Ok(()),
        (Expectation::Error(expected), Ok(got)) => Err(Mismatch::MissingError {
            engine: name,
            got,
            expected: expected.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_test;

    #[test]
    fn a_wrong_result_and_an_expected_error_are_told_apart() {
        let e = InterpreterEngine;
        let ok = parse_test("ok", "-- asm\nmov %r0, 7\nexit\n-- result\n7").unwrap();
        assert_eq!(check(&e, &ok), Ok(()));
        let wrong = parse_test("w", "-- asm\nmov %r0, 7\nexit\n-- result\n8").unwrap();
        assert!(matches!(
            check(&e, &wrong),
            Err(Mismatch::WrongResult {
                got: 7,
                expected: 8,
                ..
            })
        ));
        let must_fail = parse_test(
            "f",
            "-- asm\nldxw %r0, [%r1+100]\nexit\n-- error\nout of bounds",
        )
        .unwrap();
        assert_eq!(check(&e, &must_fail), Ok(()));
        let no_error = parse_test("n", "-- asm\nmov %r0, 1\nexit\n-- error\nboom").unwrap();
        assert!(matches!(
            check(&e, &no_error),
            Err(Mismatch::MissingError { got: 1, .. })
        ));
    }

    #[test]
    fn raw_encoding_is_compared_slot_by_slot() {
        let bad = parse_test(
            "r",
            "-- asm\nmov %r0, 1\nexit\n-- raw\n0x00000002000000b7\n0x0000000000000095\n-- result\n1",
        )
        .unwrap();
        assert!(matches!(
            check(&InterpreterEngine, &bad),
            Err(Mismatch::RawSlot { slot: 0, .. })
        ));
    }

    #[test]
    fn engine_names_parse() {
        assert_eq!("interpreter".parse(), Ok(EngineKind::Interpreter));
        assert_eq!("jit".parse(), Ok(EngineKind::Jit));
        assert_eq!(
            "warp-drive".parse::<EngineKind>(),
            Err(UnknownEngine("warp-drive".into()))
        );
    }
}
