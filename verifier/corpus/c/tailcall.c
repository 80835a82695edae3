// Dispatches to one of several programs by the first argument.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 8);
	__type(key, u32);
	__type(value, u32);
} handlers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} misses SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(dispatch, u32 op)
{
	u32 zero = 0;
	u64 *m;

	bpf_tail_call(ctx, &handlers, op & 7);
	m = bpf_map_lookup_elem(&misses, &zero);
	if (m)
		__sync_fetch_and_add(m, 1);
	return 0;
}
