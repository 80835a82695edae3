// Hashes a user buffer's first words with shifts, rotations and byte swaps.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u32);
	__type(value, u32);
} by_hash SEC(".maps");

static __always_inline u32 rol32(u32 w, int s)
{
	return (w << s) | (w >> (32 - s));
}

SEC("uprobe")
int BPF_KPROBE(hash_buf, const u32 *buf)
{
	u32 words[4], h = 0xdeadbeef, one = 1, *v;

	if (bpf_probe_read_user(words, sizeof(words), buf))
		return 0;
	for (int i = 0; i < 4; i++) {
		h ^= __builtin_bswap32(words[i]);
		h = rol32(h, 13) * 5 + 0xe6546b64;
	}
	h ^= h >> 16;
	v = bpf_map_lookup_elem(&by_hash, &h);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(&by_hash, &h, &one, BPF_ANY);
	return 0;
}
