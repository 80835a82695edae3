// SPDX-License-Identifier: MIT
/*
 * kernelretsnoop: one ring buffer record per thread of the CUDA kernel vectorAdd as it
 * exits: its block and thread index, the SM it ran on, the timestamp (host clock) and
 * the kernel's fourth argument (n), read from the probe's kprobe-shaped context.
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");

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
	bpf_ringbuf_output(&events, &e, sizeof(e), 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
