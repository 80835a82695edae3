// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * globals: a uprobe whose state lives in global variables, for a skeleton
 * loader (bpftool gen skeleton) that reads and writes them through the
 * skeleton's memory-mapped sections while the target runs.
 *
 *   .rodata  parity   set by the loader before load: count only calls whose
 *                     first argument has this parity (-1: every call)
 *   .data    weight   written by the loader at any time: what each counted
 *                     call adds to `sum`
 *   .bss     calls, sum, last_arg, last_weight
 *                     what the program saw, read by the loader
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

const volatile int parity = -1;

__u64 weight = 1;

__u64 calls;
__u64 sum;
__s64 last_arg;
__u64 last_weight;

/* The loader attaches where --target/--func say; the section is for
 * `bpftime run`, which attaches where the section names. */
SEC("uprobe/work")
int BPF_KPROBE(count_call, int arg)
{
	__u64 w;

	if (parity >= 0 && (arg & 1) != parity)
		return 0;
	/* One read of the loader's value per call, used for both records. */
	w = *(volatile __u64 *)&weight;
	__sync_fetch_and_add(&calls, 1);
	__sync_fetch_and_add(&sum, w);
	last_arg = arg;
	last_weight = w;
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
