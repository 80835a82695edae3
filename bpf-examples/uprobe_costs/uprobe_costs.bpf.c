// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * What a uprobe on work() costs apart from its program's own work, for the uprobe
 * benchmarks (scripts/bench-uprobe.sh, scripts/gpu.sh): one object per variant.
 *   -DCOST_EMPTY    a program that does nothing
 *   -DCOST_PERCPU   bpftrace's `@c = count()`: this CPU's value of a per-CPU array read,
 *                   plus one, written back (no locked instruction)
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#ifdef COST_PERCPU
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");
#endif

SEC("uprobe/work")
int cost(void *ctx)
{
#ifdef COST_PERCPU
	__u32 zero = 0;
	__u64 *count = bpf_map_lookup_elem(&counts, &zero);

	if (count)
		*count += 1;
#endif
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
