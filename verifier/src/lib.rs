//! A userspace eBPF verifier: abstract interpretation over every path, CPU and GPU rules
