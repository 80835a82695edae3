// Reads 64 bytes of user memory and finds the first newline with a bounded loop.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65);
	__type(key, u32);
	__type(value, u64);
} line_len SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(scan_line, const void *buf)
{
	char data[64];
	u32 i, n = 64;
	u64 *count;

	if (bpf_probe_read_user(data, sizeof(data), buf))
		return 0;
	for (i = 0; i < sizeof(data); i++) {
		if (data[i] == '\n') {
			n = i;
			break;
		}
	}
	count = bpf_map_lookup_elem(&line_len, &n);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}
