// SPDX-License-Identifier: MIT
/*
 * gpu_printk: bpf_printk from inside a CUDA kernel. The first thread of vectorAdd writes
 * one line as it exits, with its kernel argument n and the time it wrote it (the GPU's
 * bpf_ktime_get_ns, the host's CLOCK_MONOTONIC). The line travels through a ring on the
 * GPU, fire-and-forget (no round trip to the host), and reaches the trace pipe
 * (`bpftime trace-pipe`, or `bpftime run`'s output) once the launch completes; the
 * trace pipe's own timestamp is when it got there, so the two times give the latency.
 *
 *   bpftime run gpu_printk.bpf.o -- vec_add [N] [ITERS]
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "../common/gpu_helpers.h"

SEC("cuda:vectorAdd:exit")
int BPF_KPROBE(printk_exit, const float *a, const float *b, float *c, int n)
{
	__u64 bx, by, bz, tx, ty, tz;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	if (bx || by || bz || tx || ty || tz)
		return 0;
	bpf_printk("vectorAdd n=%d exit_ns=%llu", n, bpf_ktime_get_ns());
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
