// Sums an array map's values with bpf_loop and a callback.
#include "tool.h"

#define N 32

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, N);
	__type(key, u32);
	__type(value, u64);
} values SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} sum SEC(".maps");

struct acc {
	u64 total;
	u32 seen;
};

static long add_one(u64 i, void *data)
{
	struct acc *a = data;
	u32 key = i;
	u64 *v = bpf_map_lookup_elem(&values, &key);

	if (!v)
		return 1;
	a->total += *v;
	a->seen++;
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(sum_values)
{
	struct acc a = {};
	u32 zero = 0;
	u64 *s;

	bpf_loop(N, add_one, &a, 0);
	s = bpf_map_lookup_elem(&sum, &zero);
	if (s)
		*s = a.total;
	return a.seen;
}
