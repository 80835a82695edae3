//! Hooks with the per-thread flag in static TLS, as the agent runs them: a site whose only
//! handler is code is called straight from the stub, and function entries skip the flags.
//! A binary of its own, since the flag must be given before this process's first hook.
//! Function-entry sites here do not prime hijacked returns; `direct_primed.rs` runs the
//! same tests with priming.

const PRIME_RETURNS: bool = false;

include!("direct_cases/cases.rs");
