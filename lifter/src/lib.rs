//! Lifts eBPF bytecode to LLVM IR once, for every code generator
