//! An interpreter for the whole eBPF ISA: the reference engine and the fallback where no JIT is available
