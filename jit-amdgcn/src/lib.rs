//! Compiles lifted eBPF to AMDGCN code objects
