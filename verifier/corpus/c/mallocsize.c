// A log2 histogram of requested allocation sizes, computed with a bounded loop.
#include "tool.h"

#define SLOTS 32

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, u32);
	__type(value, u64);
} hist SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(malloc_enter, u64 size)
{
	u32 slot = 0;
	u64 *count;

	for (int i = 0; i < 63 && size > 1; i++) {
		size >>= 1;
		slot++;
	}
	if (slot >= SLOTS)
		slot = SLOTS - 1;
	count = bpf_map_lookup_elem(&hist, &slot);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}
