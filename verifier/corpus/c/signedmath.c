// Signed arithmetic on arguments: averages, remainders and sign-extended narrow values.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, u32);
	__type(value, s64);
} stats SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(signed_stats, s64 a, s32 b, s16 c)
{
	u32 k0 = 0, k1 = 1, k2 = 2;
	s64 *v;

	v = bpf_map_lookup_elem(&stats, &k0);
	if (v)
		*v = (a + b) / 2;
	v = bpf_map_lookup_elem(&stats, &k1);
	if (v && b)
		*v = a % b;
	v = bpf_map_lookup_elem(&stats, &k2);
	if (v)
		*v = (s64)c * 3;
	return 0;
}
