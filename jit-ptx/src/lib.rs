//! Compiles lifted eBPF to PTX for NVIDIA GPUs
