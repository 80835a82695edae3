//! Any byte string, as a program of each supported type, CPU and GPU, with one
//! of four map sets: the verifier must answer without panicking or hanging.
//! The body is `../check.rs`, which the stable test suite also runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../check.rs"]
mod check;

fuzz_target!(|data: &[u8]| check::check(data));
