// SPDX-License-Identifier: MIT
/*
 * gpu_timeline: CPU and GPU probes on one program, for `bpftime run --trace`: a uprobe and
 * a uretprobe on two_paths' train_step and prepare_batch (the CPU functions that launch
 * `scale`), and probes inside `scale` itself: one at entry counting threads, one at exit
 * in which the first thread prints a line. The trace then shows each call's span, the
 * launch inside it, the kernel on its GPU stream joined to the launch by a flow, and the
 * printed line inside the kernel.
 *
 *   bpftime run --trace trace.json gpu_timeline.bpf.o -- two_paths [ROUNDS]
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "../common/gpu_helpers.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void add(__u32 slot, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &slot);

	if (v)
		__sync_fetch_and_add(v, n);
}

/* train_step(Path &, float *, int) and prepare_batch(Path &, float *, int). */
SEC("uprobe/_Z10train_stepR4PathPfi")
int train_entry(struct pt_regs *ctx) { add(0, 1); return 0; }
SEC("uretprobe/_Z10train_stepR4PathPfi")
int train_exit(struct pt_regs *ctx) { add(1, 1); return 0; }
SEC("uprobe/_Z13prepare_batchR4PathPfi")
int prepare_entry(struct pt_regs *ctx) { add(2, 1); return 0; }

SEC("cuda:scale:entry")
int scale_threads(struct pt_regs *ctx)
{
	add(3, 1);
	return 0;
}

/* scale(float *x, float f, int n, int reps): n is the third parameter. */
SEC("cuda:scale:exit")
int scale_exit(struct pt_regs *ctx)
{
	__u64 bx, by, bz, tx, ty, tz;
	int n = (int)PT_REGS_PARM3(ctx);

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	if (bx || by || bz || tx || ty || tz)
		return 0;
	bpf_printk("scale n=%d done", n);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
