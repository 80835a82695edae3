//! The x86-64 JIT as a conformance engine.

use bpftime_isa::Insn;
use bpftime_jit_x86::{JitOptions, JitProgram};

use crate::engine::{unwind, Engine, InterpreterEngine, UNWIND_HELPER};

/// Compiles each program with `bpftime-jit-x86` and runs the machine code in this process.
///
/// Compiled code touches memory without checks, as it does behind the verifier in
/// production. The conformance programs are not verifiable (their memory is untyped), so
/// before any native code runs the checked interpreter runs the program over a copy of the
/// memory: a program that would stray outside its memory is refused with the interpreter's
/// reason instead of crashing the process. The result reported is always the JIT's.
#[derive(Debug, Clone)]
pub struct JitEngine {
    name: String,
    opts: JitOptions,
}

impl Default for JitEngine {
    /// The options probes attach with.
    fn default() -> Self {
        JitEngine::new("jit", JitOptions::default())
    }
}

impl JitEngine {
    /// An engine compiling with `opts`, reported under `name`.
    pub fn new(name: impl Into<String>, opts: JitOptions) -> Self {
        JitEngine {
            name: name.into(),
            opts,
        }
    }
}

fn helpers(id: u32) -> Option<u64> {
    (id == UNWIND_HELPER).then_some(unwind as *const () as u64)
}

impl Engine for JitEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, prog: &[Insn], mem: &mut [u8]) -> Result<u64, String> {
        let compiled = JitProgram::compile(prog, &helpers, &self.opts)
            .map_err(|e| format!("JIT compile: {e}"))?;
        InterpreterEngine
            .run(prog, &mut mem.to_vec())
            .map_err(|e| format!("not run natively, the checked interpreter stopped it: {e}"))?;
        // SAFETY: the checked interpreter has just run this program to completion over the
        // same bytes without leaving `mem` and its stack; the program is deterministic given
        // its memory (its only helper returns its argument), so the compiled code makes the
        // same accesses, relative to r1, as it runs over `mem` itself.
        Ok(unsafe { compiled.call(mem.as_mut_ptr() as u64, mem.len() as u64) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check, parse_test, Mismatch};

    #[test]
    fn runs_programs_and_refuses_faulting_ones_without_running_them() {
        let jit = JitEngine::default();
        let ok = parse_test(
            "ok",
            "-- asm\nldxb %r0, [%r1+1]\nadd %r0, %r2\nexit\n-- mem\n05 07\n-- result\n9",
        )
        .unwrap();
        assert_eq!(check(&jit, &ok), Ok(()));

        // Reads past its 2 bytes: natively that would read whatever lies beyond.
        let fault = parse_test(
            "fault",
            "-- asm\nldxdw %r0, [%r1+4096]\nexit\n-- mem\n05 07\n-- result\n0",
        )
        .unwrap();
        match check(&jit, &fault) {
            Err(Mismatch::UnexpectedError { engine, error, .. }) => {
                assert_eq!(engine, "jit");
                assert!(error.contains("checked interpreter"), "{error}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_program_the_lifter_rejects_is_an_error_naming_the_compiler() {
        // ja +5 jumps past the end.
        let prog = [Insn::new(0x05, 0, 0, 5, 0), Insn::new(0x95, 0, 0, 0, 0)];
        let err = JitEngine::default().run(&prog, &mut []).unwrap_err();
        assert!(err.starts_with("JIT compile:"), "{err}");
    }
}
