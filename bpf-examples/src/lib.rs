//! Example eBPF programs and their loaders
