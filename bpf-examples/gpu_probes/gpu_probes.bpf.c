// SPDX-License-Identifier: MIT
/*
 * gpu_probes: CUDA kernel probes in every spelling bpftime takes, for an
 * unmodified libbpf tool (see gpu_probes.c) and for `bpftime run`.
 *
 * - SEC("cuda:KERNEL:exit"): our own attach point, the exit of vectorAdd.
 * - SEC("kprobe/KERNEL") in a program named cuda__*: bpftime's convention for
 *   a GPU entry probe; libbpf attaches it as any kprobe.
 * - SEC("cuda:MANGLED"): the entry of the kernel by its mangled name.
 * - SEC("cuda:KERNEL:launch"): on the CPU, at each launch of the kernel (and again
 *   when it completed, see ../common/cuda_launch.h).
 *
 * The context of a GPU probe is kprobe-shaped: PT_REGS_PARM4 is vectorAdd's
 * fourth parameter, `n`.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "gpu_probes.h"
#include "../common/cuda_launch.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPU_PROBES_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 slot, __u64 by)
{
	__u64 *c = bpf_map_lookup_elem(&counts, &slot);

	if (c)
		__sync_fetch_and_add(c, by);
}

SEC("cuda:vectorAdd:exit")
int vector_add_exit(struct pt_regs *ctx)
{
	count(SLOT_EXITS, 1);
	return 0;
}

SEC("kprobe/vectorAdd")
int cuda__vector_add_entry(struct pt_regs *ctx)
{
	count(SLOT_ENTRIES, 1);
	return 0;
}

SEC("cuda:_Z9vectorAddPKfS0_Pfi")
int mangled_entry(struct pt_regs *ctx)
{
	count(SLOT_ELEMENTS, PT_REGS_PARM4(ctx));
	return 0;
}

SEC("cuda:vectorAdd:launch")
int vector_add_launch(struct bpftime_cuda_launch *ctx)
{
	/* Once per launch: the program runs again when the launch completed. */
	if (ctx->phase == BPFTIME_LAUNCH_CALLED)
		count(SLOT_LAUNCHES, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
