//! Compiles lifted eBPF to x86-64 machine code in process
