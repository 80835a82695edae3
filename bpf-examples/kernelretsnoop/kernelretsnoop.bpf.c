// SPDX-License-Identifier: MIT
/*
 * kernelretsnoop: one ring buffer record per thread of the CUDA kernel vectorAdd as it
 * exits: its block and thread index, the SM it ran on, the timestamp (host clock) and
 * the kernel's fourth argument (n), read from the probe's kprobe-shaped context.
 *
 * Built with -DPERF_OUTPUT (kernelretsnoop_perf.bpf.o), the records go through a perf
 * event array (bpf_perf_event_output, BPF_F_CURRENT_CPU) instead.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "../common/gpu_helpers.h"

struct thread_exit {
	__u64 ts;
	__u32 block;
	__u32 thread;
	__u32 sm;
	__u32 n;
};

#ifdef PERF_OUTPUT
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");
#else
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");
#endif

SEC("cuda:vectorAdd:exit")
int BPF_KPROBE(thread_exit, const float *a, const float *b, float *c, int n)
{
	struct thread_exit e = {};
	__u64 x, y, z;

	bpf_get_block_idx(&x, &y, &z);
	e.block = x;
	bpf_get_thread_idx(&x, &y, &z);
	e.thread = x;
	e.sm = bpf_get_sm_id();
	e.ts = bpf_ktime_get_ns();
	e.n = n;
#ifdef PERF_OUTPUT
	bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &e, sizeof(e));
#else
	bpf_ringbuf_output(&events, &e, sizeof(e), 0);
#endif
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
