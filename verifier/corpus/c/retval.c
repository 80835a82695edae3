// Counts failing returns (negative values) by error number, bounded to a table.
#include "tool.h"

#define MAX_ERRNO 128

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_ERRNO);
	__type(key, u32);
	__type(value, u64);
} errors SEC(".maps");

SEC("uretprobe")
int BPF_KRETPROBE(count_errors, long ret)
{
	u32 e;
	u64 *v;

	if (ret >= 0)
		return 0;
	e = -ret;
	if (e >= MAX_ERRNO)
		e = 0;
	v = bpf_map_lookup_elem(&errors, &e);
	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}
