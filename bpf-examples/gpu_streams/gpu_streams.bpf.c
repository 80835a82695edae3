// SPDX-License-Identifier: MIT
/*
 * gpu_streams: a line from every block of two_streams' `spin` kernel, at its first
 * thread's exit, naming the launch's tag, for `bpftime run --trace`. Two launches of
 * `spin` run at once on two streams, so the trace must put each line on the launch that
 * wrote it: `tag=K` belongs to the K-th launch.
 *
 *   bpftime run --trace trace.json gpu_streams.bpf.o -- two_streams [ROUNDS]
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "../common/gpu_helpers.h"

/* spin(int tag, long long cycles, unsigned int *ran): the tag is the first parameter. */
SEC("cuda:spin:exit")
int spin_exit(struct pt_regs *ctx)
{
	__u64 bx, by, bz, tx, ty, tz;

	bpf_get_thread_idx(&tx, &ty, &tz);
	if (tx || ty || tz)
		return 0;
	bpf_get_block_idx(&bx, &by, &bz);
	bpf_printk("spin tag=%d block=%d", (int)PT_REGS_PARM1(ctx), (int)bx);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
