//! The tests of `direct.rs` with every function-entry site priming its hijacked returns
//! (the trampoline's call before the landing, and the primed return stub), which only Intel
//! CPUs do by default: so that CI's AMD machines run that path too.

const PRIME_RETURNS: bool = true;

include!("direct_cases/cases.rs");
