// Work split across static functions that are not inlined (bpf-to-bpf calls).
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 128);
	__type(key, u64);
	__type(value, u64);
} seen SEC(".maps");

static __attribute__((noinline)) u64 mix(u64 a, u64 b)
{
	a ^= b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2);
	return a;
}

static __attribute__((noinline)) int remember(u64 *key, u64 value)
{
	u64 *old = bpf_map_lookup_elem(&seen, key);

	if (old) {
		*old = mix(*old, value);
		return 1;
	}
	bpf_map_update_elem(&seen, key, &value, BPF_ANY);
	return 0;
}

static __attribute__((noinline)) void fill(u64 *out, u64 a, u64 b)
{
	out[0] = mix(a, b);
	out[1] = mix(b, a);
}

SEC("uprobe")
int BPF_KPROBE(hash_args, u64 a, u64 b)
{
	u64 pair[2];

	fill(pair, a, b);
	return remember(&pair[0], pair[1]);
}
