//! Serves bpf(), perf_event_open and friends in userspace for an unmodified loader
