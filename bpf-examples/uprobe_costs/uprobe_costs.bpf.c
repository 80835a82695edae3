// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * What a uprobe on work() costs apart from its program's own work, for the uprobe
 * benchmarks (scripts/bench-uprobe.sh, scripts/gpu.sh): one object per variant.
 *   -DCOST_EMPTY    a program that does nothing
 *   -DCOST_PERCPU   bpftrace's `@c = count()`: this CPU's value of a per-CPU array read,
 *                   plus one, written back (no locked instruction)
 *   -DCOST_PAIR     the same count at the uprobe and at a uretprobe of work(): calls
 *                   and returns, each in its own slot
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#if defined(COST_PERCPU) || defined(COST_PAIR)
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *count = bpf_map_lookup_elem(&counts, &slot);

	if (count)
		*count += 1;
}
#endif

SEC("uprobe/work")
int cost(void *ctx)
{
#if defined(COST_PERCPU) || defined(COST_PAIR)
	count(0);
#endif
	return 0;
}

#ifdef COST_PAIR
SEC("uretprobe/work")
int cost_return(void *ctx)
{
	count(1);
	return 0;
}
#endif

char LICENSE[] SEC("license") = "Dual MIT/GPL";
