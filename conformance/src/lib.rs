//! Runs the bpf_conformance suite on every engine
