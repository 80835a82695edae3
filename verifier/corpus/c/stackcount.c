// Counts distinct user stacks that reach a function.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1024);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(u64));
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(stack_count)
{
	long id = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
	u32 key;
	u64 one = 1, *v;

	if (id < 0)
		return 0;
	key = id;
	v = bpf_map_lookup_elem(&counts, &key);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(&counts, &key, &one, BPF_ANY);
	return 0;
}
