// SPDX-License-Identifier: MIT
/*
 * usdt_count: USDT probes read with libbpf's bpf_usdt_arg(), and uprobes inside a
 * function (one of them on a one-byte instruction just before a loop head), counted
 * in one array. The target is bpf-examples/targets/usdt_target.c.
 */
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "usdt_count.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void add(__u32 slot, __u64 v)
{
	__u64 *c = bpf_map_lookup_elem(&counts, &slot);

	if (c)
		__sync_fetch_and_add(c, v);
}

SEC("usdt")
int BPF_USDT(tick, long i, long j)
{
	add(SLOT_TICKS, 1);
	add(SLOT_TICK_SUM, j);
	return 0;
}

SEC("usdt")
int BPF_USDT(guarded, long i)
{
	add(SLOT_GUARDED, 1);
	add(SLOT_GUARD_SUM, i);
	return 0;
}

SEC("uprobe")
int at_nop(struct pt_regs *ctx)
{
	add(SLOT_NOP, 1);
	return 0;
}

SEC("uprobe")
int at_head(struct pt_regs *ctx)
{
	add(SLOT_HEAD, 1);
	add(SLOT_HEAD_SUM, PT_REGS_PARM1(ctx));
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
