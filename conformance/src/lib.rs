//! Runs the bpf_conformance suite on every engine.
//!
//! [`parse_test`] reads one `.data` file, [`check`] assembles it and runs it on an
//! [`Engine`]; the interpreter is one engine, and a JIT or a GPU engine plugs in through
//! the same trait so that one corpus judges them all.

#![warn(unreachable_pub)]

mod data;
mod engine;
pub mod gpu;
mod gpu_runner;
mod jit;

pub use data::{
    default_suite_dir, parse_test, suite_files, test_name, Expectation, ParseError, SuiteError,
    TestCase, SUITE_DIR_ENV,
};
pub use engine::{check, Engine, EngineKind, InterpreterEngine, Mismatch, UnknownEngine};
pub use jit::JitEngine;

/// The engine of this kind.
pub fn engine(kind: EngineKind) -> Box<dyn Engine> {
    match kind {
        EngineKind::Interpreter => Box::new(InterpreterEngine),
        EngineKind::Gpu => Box::new(gpu::GpuEngine::new()),
        EngineKind::Jit => Box::new(JitEngine::default()),
    }
}
